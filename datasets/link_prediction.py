"""Link prediction with an encoder and a DistMult decoder, the same model for neurovec and its PyG twin.

::

    graph = rgcn_encoder(kg, hidden=32)                                 # neurovec.datasets.rgcn
    module = neurovec.compile(graph, Settings.preset("default", dynamic_facts=("x",)))
    model = LinkPredictor(NeurovecEncoder(module), kg.n_entities, kg.n_relations, 32, seed=0)
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        negatives = corrupt(positives, kg.n_entities, 1, generator)    # fresh negatives, in torch
        loss = model.loss(positives, negatives)                         # one compiled module, every step

:class:`LinkPredictor` holds the entity embeddings ``node_emb`` (the encoder's input, replaced
at every call of the compiled module: ``Settings(dynamic_facts=("x",))``) and the DistMult
relation embeddings ``rel_emb``. The encoder maps the embeddings to entity encodings ``z``;
a triple's score is DistMult's ``sum_k z_h[k] rel_r[k] z_t[k]``. Negatives are sampled in torch
each step, so nothing is grounded or compiled again during training. The PyG twin
(:mod:`neurovec.datasets.kg_twins`) plugs its encoder into the same class, so that both
train identically.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import DatasetError

__all__ = ["LinkPredictor", "NeurovecEncoder", "DistMult", "corrupt", "embedding_init"]


def embedding_init(n: int, dim: int, seed: int) -> np.ndarray:
    """Seeded initial embeddings, Glorot-uniform over the (n, dim) table as PyG's RGCN link-prediction example
    initialises them (float64, from numpy): DistMult's initial scores stay small."""
    bound = np.sqrt(6.0 / (n + dim))
    return np.random.default_rng(seed).uniform(-bound, bound, size=(n, dim))


class NeurovecEncoder(nn.Module):
    """A compiled neurovec module whose fact layer ``fact`` is the encoder's input (declared dynamic)."""

    def __init__(self, module: nn.Module, fact: str = "x"):
        super().__init__()
        self.module = module
        self.fact = fact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(facts={self.fact: x})


class DistMult(nn.Module):
    """DistMult's score ``sum_k z_h[k] rel_r[k] z_t[k]`` with a learnable ``rel_emb`` of shape (relations, dim)."""

    def __init__(self, n_relations: int, dim: int, seed: int = 0):
        super().__init__()
        self.rel_emb = nn.Parameter(torch.from_numpy(embedding_init(n_relations, dim, seed + 1)))

    def forward(self, z: torch.Tensor, triples: torch.Tensor) -> torch.Tensor:
        # index_select, not z[h]: its backward is index_add_, where advanced indexing's index_put_ sorts the
        # indices (on CPU 2-3x slower for the ~40,000 triples of a Kinship step).
        h, r, t = triples.T
        return (z.index_select(0, h) * self.rel_emb.index_select(0, r) * z.index_select(0, t)).sum(-1)

    def tails(self, z: torch.Tensor, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Scores of every entity as the tail of ``(h, r, ?)``: (B, n_entities)."""
        return (z[h] * self.rel_emb[r]) @ z.T

    def heads(self, z: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Scores of every entity as the head of ``(?, r, t)``: (B, n_entities)."""
        return (z[t] * self.rel_emb[r]) @ z.T


class LinkPredictor(nn.Module):
    """``node_emb`` -> encoder -> ``z``; DistMult scores; binary cross-entropy over positives and negatives.

    ``encoder`` maps the (n_entities, dim) embeddings to encodings; ``regularization`` weighs the
    mean squares of ``z`` and ``rel_emb`` added to the loss (PyG's RGCN link-prediction example).
    """

    def __init__(self, encoder: nn.Module, n_entities: int, n_relations: int, dim: int, seed: int = 0,
                 regularization: float = 0.01, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.encoder = encoder
        self.node_emb = nn.Parameter(torch.from_numpy(embedding_init(n_entities, dim, seed)))
        self.decoder = DistMult(n_relations, dim, seed)
        self.regularization = float(regularization)
        self.to(dtype)

    def encode(self) -> torch.Tensor:
        return self.encoder(self.node_emb)

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encode(), triples)

    def loss(self, positives: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        z = self.encode()
        scores = self.decoder(z, torch.cat([positives, negatives]))
        labels = torch.cat([scores.new_ones(positives.shape[0]), scores.new_zeros(negatives.shape[0])])
        loss = nn.functional.binary_cross_entropy_with_logits(scores, labels)
        if self.regularization:
            loss = loss + self.regularization * (z.pow(2).mean() + self.decoder.rel_emb.pow(2).mean())
        return loss

    @torch.no_grad()
    def scorers(self):
        """``(score_tails, score_heads)`` over the current encodings, for :func:`neurovec.datasets.kg.ranking_metrics`."""
        z = self.encode()
        return (lambda h, r: self.decoder.tails(z, h, r)), (lambda r, t: self.decoder.heads(z, r, t))


def corrupt(triples: torch.Tensor, n_entities: int, per_positive: int = 1,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """``per_positive`` negatives per triple: the head or the tail (a fair coin each) replaced by a uniform entity.

    Whole-tensor, seeded by ``generator``; negatives are not filtered against the true triples
    (the usual local closed-world sampling).
    """
    if per_positive < 1:
        raise DatasetError(f"per_positive must be at least 1 (got {per_positive})")
    negatives = triples.repeat(per_positive, 1)
    replacement = torch.randint(0, n_entities, (negatives.shape[0],), generator=generator)
    tail = torch.rand(negatives.shape[0], generator=generator) < 0.5
    negatives[:, 2] = torch.where(tail, replacement, negatives[:, 2])
    negatives[:, 0] = torch.where(tail, negatives[:, 0], replacement)
    return negatives
