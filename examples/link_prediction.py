"""Link prediction on Cora: node embeddings from a compiled neurovec GCN, the pair decoder in torch.

    python examples/link_prediction.py [--data-dir ../shared/data/planetoid] [--epochs 100]

10% of Cora's undirected edges are held out for testing. The GCN (2 layers, 64-wide
embeddings, ``out_dim=64``) is compiled over the graph of the remaining edges only:
neurovec gives one embedding per node, and everything about pairs stays in torch: the
decoder scores a pair by the dot product of its two embeddings, and each epoch trains
on the training edges against as many random node pairs (negatives, new each epoch),
with binary cross-entropy. Reported: the ROC AUC of held-out edges against as many
random pairs.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np
import torch
import torch.nn.functional as F

import neurovec
from neurovec.datasets import gnn
from neurovec.datasets.planetoid import load_planetoid, normalize_features


def auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """The probability that a held-out edge scores above a random pair (ties count half)."""
    scores = torch.cat([positive, negative])
    ranks = scores.argsort().argsort().double() + 1
    n_pos, n_neg = positive.numel(), negative.numel()
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("NEUROVEC_DATA"))
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    cora = load_planetoid("Cora", args.data_dir)
    src, dst = cora.edge_index
    pairs = np.unique(np.sort(np.stack([src, dst], 1), axis=1), axis=0)        # undirected edges, once each
    test = rng.random(len(pairs)) < 0.1
    train_pairs, test_pairs = pairs[~test], pairs[test]
    graph_edges = np.concatenate([train_pairs, train_pairs[:, ::-1]]).T          # messages both ways
    train_graph = dataclasses.replace(cora, x=normalize_features(cora.x), edge_index=graph_edges)
    module = neurovec.compile(gnn.gcn(train_graph, hidden=128, layers=2, out_dim=64, seed=args.seed))
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    n = cora.n_nodes
    positive = torch.as_tensor(train_pairs.T)
    for epoch in range(args.epochs):
        embedding = module()                                                     # (nodes, 64), from neurovec
        negative = torch.randint(0, n, positive.shape)
        score = lambda p: (embedding[p[0]] * embedding[p[1]]).sum(-1)           # the decoder, in torch
        logits = torch.cat([score(positive), score(negative)])
        labels = torch.cat([torch.ones(positive.shape[1]), torch.zeros(negative.shape[1])])
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if epoch % 20 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    with torch.no_grad():
        embedding = module()
        held_out = torch.as_tensor(test_pairs.T)
        random = torch.randint(0, n, held_out.shape)
        score = lambda p: (embedding[p[0]] * embedding[p[1]]).sum(-1)
        print(f"held-out edges: {held_out.shape[1]}, ROC AUC {auc(score(held_out), score(random)):.3f}")


if __name__ == "__main__":
    main()
