"""Synthetic large graphs for node classification: R-MAT edges, features and labels that depend on them.

    ds = rmat_dataset("arxiv-like", seed=0)          # 169,343 nodes, 1,166,243 edges, 128 features, 40 classes
    ds = rmat_dataset(nodes=10_000, edges=100_000, features=32, classes=5, seed=1)

Edges: R-MAT (Chakrabarti et al. 2004) with Graph500's parameters ``a, b, c, d =
0.57, 0.19, 0.19, 0.05``: each edge picks one quadrant of the adjacency matrix per
bit of the node ids, so degrees are skewed (a few hubs, many leaves), as in
citation and co-purchase graphs. Node ids are then shuffled by a seeded
permutation (Graph500 does so too, so that ids carry no locality), folded onto
``nodes`` ids, and the edges come in random order. Self loops and repeated
edges are kept, as R-MAT draws them (the templates handle both as PyG does).
``undirected=True`` draws half the edges and adds each reversed (OGB stores
ogbn-products so; ogbn-arxiv is directed).

Features and labels: a planted teacher, so that the labels are learnable and
depend on the graph. Every node gets a latent class, its features are that
class's centroid plus Gaussian noise (float32), and its label is the class a
fixed random linear map gives to its own features plus the mean of its
in-neighbours' (a one-layer GNN; nodes without in-neighbours use their own). A GNN
can thus reach high accuracy, an MLP less. Split masks are random (seeded) with
the given fractions.

Everything is whole-array numpy, a chunk of edges at a time (no Python loop per
node or edge): ``products-like`` (2,449,029 nodes, 61,859,140 edges, 100 features)
takes about a minute and peaks at a few GB beyond its result (about 2 GB: 1 GB of
edge ids, 1 GB of float32 features).
"""
from __future__ import annotations

import math

import numpy as np

from ._common import DatasetError
from .nodes import NodeDataset

__all__ = ["rmat_dataset", "rmat_edges", "SHAPES", "GRAPH500"]

GRAPH500 = (0.57, 0.19, 0.19, 0.05)

#: name -> (nodes, edges, features, classes, undirected, (train, val, test) fractions)
SHAPES = {
    "arxiv-like": (169_343, 1_166_243, 128, 40, False, (0.54, 0.18, 0.28)),
    "products-like": (2_449_029, 61_859_140, 100, 47, True, (0.08, 0.02, 0.90)),
}

_CHUNK = 1 << 22  # edges drawn at a time


def rmat_edges(nodes: int, edges: int, seed: int = 0, probabilities=GRAPH500) -> np.ndarray:
    """``(2, edges)`` int64 R-MAT edges over ``nodes`` ids (see the module doc)."""
    if nodes < 1 or edges < 0:
        raise DatasetError(f"need nodes >= 1 and edges >= 0 (got nodes={nodes}, edges={edges})")
    a, b, c, d = probabilities
    if min(a, b, c, d) < 0 or not math.isclose(a + b + c + d, 1.0):
        raise DatasetError(f"R-MAT probabilities must be >= 0 and sum to 1 (got {probabilities})")
    scale = max(1, math.ceil(math.log2(nodes)))
    rng = np.random.default_rng([seed, 1])
    permutation = rng.permutation(1 << scale)
    out = np.empty((2, edges), dtype=np.int64)
    for start in range(0, edges, _CHUNK):
        m = min(_CHUNK, edges - start)
        src = np.zeros(m, dtype=np.int64)
        dst = np.zeros(m, dtype=np.int64)
        for _ in range(scale):
            r = rng.random(m)
            # quadrant: a (0,0), b (0,1), c (1,0), d (1,1)
            down = r >= a + b
            right = ((r >= a) & (r < a + b)) | (r >= a + b + c)
            src = (src << 1) | down
            dst = (dst << 1) | right
        out[0, start:start + m] = permutation[src] % nodes
        out[1, start:start + m] = permutation[dst] % nodes
    return out


def _in_mean(x: np.ndarray, edge_index: np.ndarray) -> np.ndarray:
    """The mean of every node's in-neighbours' rows of ``x`` (its own row where it has none).

    One sparse CSR product (rows: targets), repeated edges counted each time.
    """
    import torch

    n = x.shape[0]
    src, dst = edge_index
    order = np.argsort(dst, kind="stable")
    degree = np.bincount(dst, minlength=n)
    crow = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=crow[1:])
    adjacency = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(src[order]),
                                        torch.ones(src.size, dtype=torch.float32), (n, n), check_invariants=False)
    total = (adjacency @ torch.from_numpy(x)).numpy()
    degree = degree.astype(np.float32)[:, None]
    return np.where(degree > 0, total / np.maximum(degree, 1), x)


def rmat_dataset(shape: str | None = None, *, nodes: int | None = None, edges: int | None = None,
                 features: int | None = None, classes: int | None = None, undirected: bool | None = None,
                 split=None, seed: int = 0, noise: float = 2.0) -> NodeDataset:
    """A synthetic node-classification dataset: a named ``shape`` (:data:`SHAPES`) or the sizes given.

    Keywords override the shape's values. ``noise`` is the features' Gaussian noise
    against centroids of unit scale: the larger, the more the graph must help.
    """
    if shape is not None:
        if shape not in SHAPES:
            raise DatasetError(f"unknown synthetic shape {shape!r} (expected one of {', '.join(SHAPES)})")
        defaults = dict(zip(("nodes", "edges", "features", "classes", "undirected", "split"), SHAPES[shape]))
    else:
        defaults = {"undirected": False, "split": (0.6, 0.2, 0.2)}
    given = {"nodes": nodes, "edges": edges, "features": features, "classes": classes, "undirected": undirected,
             "split": split}
    values = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    missing = [k for k in ("nodes", "edges", "features", "classes") if k not in values]
    if missing:
        raise DatasetError(f"rmat_dataset: give a shape or {', '.join(missing)}")
    n, e, f, k = (int(values[name]) for name in ("nodes", "edges", "features", "classes"))
    if f < 1 or k < 1:
        raise DatasetError(f"need features >= 1 and classes >= 1 (got features={f}, classes={k})")
    fractions = tuple(float(s) for s in values["split"])
    if len(fractions) != 3 or min(fractions) < 0 or sum(fractions) > 1 + 1e-9:
        raise DatasetError(f"split must be three fractions (train, val, test) summing to at most 1 (got {fractions})")
    if values["undirected"]:
        half = rmat_edges(n, e // 2, seed)
        edge_index = np.concatenate([half, half[::-1]], axis=1)
        if e % 2:
            edge_index = np.concatenate([edge_index, rmat_edges(n, 1, seed + 1)], axis=1)
    else:
        edge_index = rmat_edges(n, e, seed)
    rng = np.random.default_rng([seed, 2])
    edge_index = edge_index[:, rng.permutation(e)] if e <= 1 << 26 else edge_index
    latent = rng.integers(0, k, n)
    centroids = rng.standard_normal((k, f)).astype(np.float32)
    x = centroids[latent]
    x += noise * rng.standard_normal((n, f), dtype=np.float32)
    teacher = rng.standard_normal((f, k)).astype(np.float32)
    y = ((x + _in_mean(x, edge_index)) @ teacher).argmax(axis=1).astype(np.int64)
    order = rng.permutation(n)
    cuts = np.cumsum([int(round(s * n)) for s in fractions])
    masks = []
    for lo, hi in zip([0, *cuts[:2]], cuts):
        mask = np.zeros(n, dtype=bool)
        mask[order[lo:hi]] = True
        masks.append(mask)
    name = shape or f"rmat-{n}-{e}"
    return NodeDataset(name, x, edge_index, y, *masks, num_classes=k,
                       info={"generator": "R-MAT", "probabilities": GRAPH500, "seed": seed, "noise": noise})
