"""What ``engines/relation_ops.py`` gives a compiled RGCN training step, were the generated forward to call it.

    python -m neurovec.benchmarks.relation_ops --relations 100 --threads 1     # the hetero-100 cell's graph

``neurovec.compile`` (``default``) writes each chunked relational layer as three statements: the product rows'
inputs gathered (``index_select``, or a ``gather_sum`` reading one row per row), one ``torch.bmm`` over the chunks
(``compiler/passes/relation_products.py``), and the sum of each output's rows (``gather_sum``). :func:`fuse_source`
rewrites the program's source so that each such triple is one :func:`~neurovec.engines.relation_ops.
chunked_product_sum` call (what the code generator would write: see ``docs/knowledge_graphs.md``); the script
then trains both, interleaved in one process: a step each, alternately, CPU time (``time.process_time``), the
medians and their ratio. It checks first that both give the same loss and gradients (float32, relative 1e-4).

This is a measurement of a code generator change that is not made (``engines/torch_module.py`` is not part of
this work): the rewrite works on the generated text and refuses any program where the pattern is not exactly
there.
"""
from __future__ import annotations

import argparse
import re
import time

import numpy as np
import torch

__all__ = ["fuse_source", "main"]

_GATHER = re.compile(r"^    (?P<x>\w+) = (?:(?P<src>\w+)\.index_select\(0, self\.(?P<idx>\w+)\)|"
                     r"gather_sum\((?P<src2>\w+), self\.(?P<csr_x>\w+)\)|self\.(?P<rows>\w+))\s")
_BMM = re.compile(r"^    (?P<lin>\w+) = torch\.bmm\((?P<x>\w+)\.view\((?P<k>\d+), (?P<c>\d+), (?P<i>\d+)\), "
                  r"(?P<w>\w+)\.transpose\(1, 2\)\)\.view\((?P<rows>\d+), (?P<o>\d+)\)\s")
_SUM = re.compile(r"^    (?P<out>\w+) = gather_sum\((?P<lin>\w+), self\.(?P<csr>\w+)(?:, (?P<bias>[^)]+\)?))?\)\s")


def fuse_source(code: str, module) -> tuple[str, int]:
    """The source with each (gather, chunked bmm, sum) triple as one ``relation_ops.chunked_product_sum`` call (the
    fused kernel at one thread, the same three statements otherwise). Returns the source and the number of fused
    layers. A triple whose intermediates anything else reads, or whose gather or sum has values, stays. (The
    gather may be a constant of the program: then its rows are read in order.)"""
    lines = code.splitlines(keepends=True)
    uses = {}
    for line in lines:
        for name in re.findall(r"\b\w+\b", line):
            uses[name] = uses.get(name, 0) + 1
    defined = {}
    for k, line in enumerate(lines):
        match = re.match(r"^    (\w+) = ", line)
        if match:
            defined[match.group(1)] = k
    readers = {}
    for k, line in enumerate(lines):
        total = _SUM.match(line)
        if total:
            readers[total["lin"]] = k
    drop, fused = set(), 0
    for k, line in enumerate(lines):
        bmm = _BMM.match(line)
        if not bmm or bmm["x"] not in defined or bmm["lin"] not in readers:
            continue
        gather = _GATHER.match(lines[defined[bmm["x"]]])
        total = _SUM.match(lines[readers[bmm["lin"]]])
        if not gather or uses[bmm["x"]] != 2 or uses[bmm["lin"]] != 2:
            continue
        csr = getattr(module, total["csr"])._buffers
        rows = int(bmm["rows"])
        if gather["idx"]:
            src, index = gather["src"], f"self.{gather['idx']}"
        elif gather["csr_x"]:
            csr_x = getattr(module, gather["csr_x"])._buffers
            if csr_x.get("values") is not None or not bool(torch.all(csr_x["ptr"].diff() == 1)):
                continue
            src, index = gather["src2"], f"self.{gather['csr_x']}"
        else:
            src, index = gather["x"], "None"
        if csr.get("values") is not None or csr["t_ptr"].numel() != rows + 1:
            continue
        bias = f", {total['bias']}" if total["bias"] else ""
        lines[readers[bmm["lin"]]] = (f"    {total['out']} = chunked_product_sum({src}, {index}, {bmm['w']}, "
                                      f"self.{total['csr']}{bias})\n")
        drop.add(k)
        if src != gather["x"]:   # a gather, left out; a constant's line stays (it names the rows read)
            drop.add(defined[bmm["x"]])
        fused += 1
    return "".join(line for k, line in enumerate(lines) if k not in drop), fused


def _forward(source: str):
    from ..engines import kernels, runtime
    from ..engines.functions import TRANSFORM_FUNCTIONS, order_signed_zeros, preferred_zeros
    from ..engines.relation_ops import chunked_product_sum

    namespace = {"torch": torch, "T": TRANSFORM_FUNCTIONS, "segment_reduce": kernels.segment_reduce,
                 "scatter_reduce": kernels.scatter_reduce_native, "dense_reduce": kernels.dense_reduce,
                 "strided_reduce": runtime.strided_reduce, "gather_sum": runtime.gather_sum,
                 "preferred_zeros": preferred_zeros, "order_signed_zeros": order_signed_zeros,
                 "chunked_product_sum": chunked_product_sum}
    exec(compile(source, "<neurovec-fused-program>", "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace["forward"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relations", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each, after 2 of warm-up")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import neurovec
    from neurovec import Settings
    from neurovec.datasets import kg as kgmod
    from neurovec.datasets import rgcn

    from .kg import HETERO

    data = kgmod.synthetic_hetero(n_relations=args.relations, seed=0, **HETERO)
    spec = rgcn.RGCNSpec.create(HETERO["n_features"], args.relations, [16, HETERO["n_classes"]])
    module = neurovec.compile(rgcn.rgcn(data.x, data.edge_index, data.edge_type, spec, seed=0),
                              Settings.preset("default"))
    source, fused = fuse_source(module.code, module)
    if not fused:
        raise SystemExit("no chunked relational layer to fuse in this program")
    forward = _forward(source)
    labels, train = torch.from_numpy(data.labels[data.train_nodes]), torch.from_numpy(data.train_nodes)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    params = list(module.parameters())

    def step(run, update=True):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(run()[train], labels)
        loss.backward()
        grads = [p.grad.clone() for p in params]
        if update:
            optimizer.step()
        return float(loss.detach()), grads

    compiled, fused_run = module, (lambda: forward(module))
    (loss_a, grads_a), (loss_b, grads_b) = step(compiled, False), step(fused_run, False)
    worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(grads_a, grads_b))
    if abs(loss_a - loss_b) > 1e-4 * abs(loss_a) or worst > 1e-4:
        raise SystemExit(f"the fused program differs: loss {loss_a} vs {loss_b}, gradients {worst:.2e} relative")
    for _ in range(2):
        step(compiled)
        step(fused_run)
    times = {"default": [], "fused": []}
    for _ in range(args.steps):
        for key, run in (("default", compiled), ("fused", fused_run)):
            start = time.process_time()
            step(run)
            times[key].append(time.process_time() - start)
    result = {"relations": args.relations, "threads": args.threads, "fused_layers": fused,
              "default_ms": 1000 * float(np.median(times["default"])),
              "fused_ms": 1000 * float(np.median(times["fused"])), "gradient_rel_diff": worst}
    result["speedup"] = result["default_ms"] / result["fused_ms"]
    print(f"hetero-{args.relations}, {args.threads} thread(s), CPU ms per training step (medians of "
          f"{args.steps}, interleaved): default {result['default_ms']:.1f}, default with its {fused} chunked layers "
          f"fused {result['fused_ms']:.1f}: {result['speedup']:.2f}x (gradients agree to {worst:.1e})")
    return result


if __name__ == "__main__":
    main()
