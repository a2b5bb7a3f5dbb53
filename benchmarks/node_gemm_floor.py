"""The GEMMs alone of a full-batch node step: a floor no exact float32 engine goes under.

A GCN or SAGE layer of a training step multiplies every node's row by its weight (forward, ``x @ W.T``),
takes the weight's gradient (``g.T @ x``) and, past the first layer (whose input is a constant), the
input's gradient (``g @ W``); SAGE does this for two weights per layer (``lin_l`` and ``lin_r``), GCN for one.
PyG and neurovec run the same products with torch's own GEMM, so their time is a floor for both.

    python benchmarks/node_gemm_floor.py --threads 1            # arxiv-like: 169,343 nodes, 128 -> 128 -> 128 -> 40
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def step_ms(nodes: int, dims: list[tuple[int, int]], weights_per_layer: int, reps: int,
            reuse: bool = False) -> tuple[float, float]:
    """Median wall and CPU ms of one step's GEMMs: each into a fresh tensor (as torch's ops allocate
    them, page faults included), or with ``reuse`` into memory written before (``out=``: the GEMMs alone)."""
    x = torch.randn(nodes, dims[0][0])
    grads = {out: torch.randn(nodes, out) for _, out in dims}
    weights = {shape: torch.randn(shape[1], shape[0]) for shape in dims}
    outs: dict[tuple, torch.Tensor] = {}

    def mm(a, b, key):
        if not reuse:
            return a @ b
        if key not in outs:
            outs[key] = torch.empty(a.shape[0], b.shape[1])
        return torch.mm(a, b, out=outs[key])

    def step():
        for layer, (fan_in, fan_out) in enumerate(dims):
            w, g = weights[(fan_in, fan_out)], grads[fan_out]
            for k in range(weights_per_layer):
                mm(x, w.t(), ("y", layer, k))
                mm(g.t(), x, ("gw", layer, k))
                if layer > 0:
                    mm(g, w, ("gx", layer, k))

    step()
    walls, cpus = [], []
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 128, 128, 40], help="input, hidden..., classes")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="GEMMs into memory written before (out=): no page faults")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dims = list(zip(args.widths[:-1], args.widths[1:]))
    for model, per_layer in (("gcn", 1), ("sage", 2)):
        wall, cpu = step_ms(args.nodes, dims, per_layer, args.reps, args.reuse)
        into = "reused outputs" if args.reuse else "fresh outputs"
        print(f"{model}: GEMMs of one step {wall:.1f} ms wall, {cpu:.1f} ms CPU ({args.threads} thread(s), {into})")


if __name__ == "__main__":
    main()
