"""Link prediction on Kinship and UMLS: an RGCN encoder and a DistMult decoder, trained identically with neurovec
and with its PyTorch Geometric twin, evaluated by filtered MRR and Hits@k.

    python examples/train_kg.py --data-dir ../shared/data/kg                    # both datasets, both engines
    python examples/train_kg.py --datasets kinships --epochs 50 --engines neurovec

Both engines start from the same weights (the twin's are copied from the compiled template), see the same
negatives (one torch generator per engine, same seed) and take the same Adam steps; in float64 (the default here)
their metrics agree to printing precision. The neurovec encoder is compiled once: the entity embeddings are its
dynamic fact layer (``Settings(dynamic_facts=("x",))``), the negatives are drawn in torch each step, and nothing is
grounded or compiled again during training. The filtered ranks are taken over both sides of every test triple
against all known triples (``neurovec.datasets.kg.ranking_metrics``; ties count half). The published rows are
DistMult, ComplEx and ConvE on the same splits, as reported by Lin et al. (2018), Table 2, for reference (other
models and training setups than this RGCN).
"""
from __future__ import annotations

import argparse
import time

import torch

import neurovec
from neurovec import Settings
from neurovec.datasets import kg as kgmod
from neurovec.datasets import rgcn
from neurovec.datasets.link_prediction import LinkPredictor, NeurovecEncoder, corrupt

#: Filtered (MRR, Hits@1, Hits@10) on these splits, Lin, Socher and Xiong (EMNLP 2018), Table 2.
PUBLISHED = {
    "kinships": {"DistMult": (0.614, 0.487, 0.904), "ComplEx": (0.884, 0.818, 0.981), "ConvE": (0.871, 0.797, 0.981)},
    "umls": {"DistMult": (0.868, 0.821, 0.967), "ComplEx": (0.934, 0.890, 0.992), "ConvE": (0.957, 0.932, 0.994)},
}


def make_model(graph: kgmod.KnowledgeGraph, engine: str, args, dtype: torch.dtype) -> tuple[LinkPredictor, dict]:
    """The link predictor of ``engine``; neurovec's template fixes the initial weights of both engines."""
    encoder_graph = rgcn.rgcn_encoder(graph, hidden=args.dim, layers=args.layers, num_bases=args.bases,
                                      seed=args.seed)
    start = time.perf_counter()
    module = neurovec.compile(encoder_graph, Settings.preset(args.preset, dynamic_facts=("x",)), dtype=dtype)
    info = {"compile_s": time.perf_counter() - start}
    if engine == "neurovec":
        encoder = NeurovecEncoder(module)
    else:
        from neurovec.datasets import kg_twins
        spec = rgcn.RGCNSpec.create(args.dim, 2 * graph.n_relations, [args.dim] * args.layers, num_bases=args.bases)
        twin = kg_twins.RGCNTwin(spec, fast=engine == "pyg-fast").to(dtype)
        kg_twins.copy_weights(module, twin)
        encoder = kg_twins.TwinEncoder(twin, *graph.message_edges())
        info = {"compile_s": 0.0}
    model = LinkPredictor(encoder, graph.n_entities, graph.n_relations, args.dim, seed=args.seed,
                          regularization=args.regularization, dtype=dtype)
    return model, info


def train(graph: kgmod.KnowledgeGraph, engine: str, args) -> dict:
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    model, info = make_model(graph, engine, args, dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    positives = torch.from_numpy(graph.train)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        negatives = corrupt(positives, graph.n_entities, args.negatives, generator)
        optimizer.zero_grad()
        loss = model.loss(positives, negatives)
        loss.backward()
        optimizer.step()
        if args.verbose and (epoch % args.verbose == 0 or epoch == args.epochs):
            print(f"  {graph.name} {engine} epoch {epoch}: loss {float(loss.detach()):.6f}", flush=True)
    info["train_s"] = time.perf_counter() - start
    info["loss"] = float(loss.detach())
    known = kgmod.TripleFilter(graph.known_triples(), graph.n_entities, graph.n_relations)
    score_tails, score_heads = model.scorers()
    info.update(kgmod.ranking_metrics(score_tails, score_heads, graph.test, known))
    return info


def table(results: dict) -> str:
    lines = ["| dataset | model | MRR | Hits@1 | Hits@3 | Hits@10 | final loss | train s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, engines in results.items():
        for engine, r in engines.items():
            lines.append(f"| {name} | RGCN + DistMult, {engine} | {r['mrr']:.4f} | {r['hits@1']:.4f} | "
                         f"{r['hits@3']:.4f} | {r['hits@10']:.4f} | {r['loss']:.6f} | {r['train_s']:.1f} |")
        for model, (mrr, h1, h10) in PUBLISHED.get(name, {}).items():
            lines.append(f"| {name} | {model} (Lin et al., 2018) | {mrr:.3f} | {h1:.3f} | | {h10:.3f} | | |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["kinships", "umls"])
    parser.add_argument("--engines", nargs="+", default=["neurovec", "pyg"], choices=["neurovec", "pyg", "pyg-fast"])
    parser.add_argument("--data-dir", default=None, help="folder with kinships/ and umls/ (default: $NEUROVEC_DATA, "
                                                         "else downloaded into the cache)")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--bases", type=int, default=None, help="basis decomposition (default: a weight per relation)")
    parser.add_argument("--negatives", type=int, default=4, help="negatives per positive triple, each step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--regularization", type=float, default=0.01)
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--verbose", type=int, default=0, help="print the loss every N epochs")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    for name in args.datasets:
        graph = kgmod.load_kg(name, data_dir=args.data_dir)
        print(graph, flush=True)
        results[name] = {engine: train(graph, engine, args) for engine in args.engines}
        if len(args.engines) > 1:
            first, *others = args.engines
            for other in others:
                gap = max(abs(results[name][first][k] - results[name][other][k])
                          for k in ("mrr", "hits@1", "hits@3", "hits@10"))
                print(f"{name}: largest metric difference {first} vs {other}: {gap:.2e}", flush=True)
    print(table(results))
    return results


if __name__ == "__main__":
    main()
