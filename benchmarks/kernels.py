"""Micro-benchmark of segment reductions and gather + sum (``neurovec.engines.kernels``).

    python benchmarks/kernels.py                  # PROTEINS GCN layer, F = 3, 16 and 32
    python benchmarks/kernels.py --reduce sum max --dims 16 --reps 20 --threads 1
    python benchmarks/kernels.py --sweep          # sizes behind choose_kernel's thresholds
    python benchmarks/kernels.py --malloc-keep    # keep freed memory (see below)

Sizes: one GCN layer over all PROTEINS graphs -- 43,471 nodes, 162,088 directed
edges plus one self-loop per node (205,559 edges); segments are nodes, their sizes
the in-degrees + 1 read from ``PROTEINS_A.txt``. Values float32 (``--dtype``).

Compared, each forward and backward (``torch.autograd.grad``) timed separately,
median over ``--reps`` repetitions after warm-up, methods interleaved round-robin
so that load from other processes spreads over all of them:

* neurovec ``segment_reduce``: auto (the C++ kernels where built), with the C++
  kernels switched off, and each forced torch forward kernel,
* torch-scatter ``segment_csr`` (if importable; its own backward),
* PyTorch ``scatter_reduce`` and ``index_add`` (PyTorch's backward),
* inductor: ``torch.compile`` of the ``index_add`` / ``scatter_reduce`` version
  (the fused C++ loops it generates, forward and backward),
* ``torch.segment_reduce`` (PyTorch's backward),
* and for gather -> per-edge coefficient (GCN's ``1/sqrt(deg_i deg_j)``) -> sum:
  :class:`~neurovec.engines.kernels.GatherSum` (C++ kernel, or MKL's CSR matmul
  with the C++ kernels off) vs. ``index_select`` + multiply + each of the above.

Only the neurovec rows and ``scatter_reduce`` have the reference engine's gradient
semantics for max/min (ties share the gradient evenly): torch-scatter routes all
of it to one argmax, and ``torch.segment_reduce`` (torch 2.13) does not divide
*negative* gradients among ties. Their rows are timings, not alternatives.
OpenMP threads of the C++ kernels follow ``torch.get_num_threads()`` (``--threads``).

Note on CPU timings: glibc serves blocks over 32 MiB with fresh ``mmap`` and
unmaps them on free, so every op whose output exceeds that (here the ``(E, 64)``
float32 gradient of the backward) pays ~13k page faults per call, often more than
the kernel itself. ``--malloc-keep`` raises glibc's mmap/trim thresholds (in this
process only) to show the kernels' own cost; the default shows what a training
loop with the default allocator sees.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from neurovec.engines import kernels as K
from neurovec.engines import native

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tu" / "PROTEINS" / "PROTEINS_A.txt"


def proteins_layer(path: Path = DATA):
    """``(src, counts)``: edges sorted by target, sources of each, in-degree + 1 per node."""
    pairs = np.loadtxt(path, delimiter=",", dtype=np.int64) - 1  # 1-based "src, dst" lines
    n = int(pairs.max()) + 1
    loops = np.arange(n, dtype=np.int64)
    src = np.concatenate([pairs[:, 0], loops])
    dst = np.concatenate([pairs[:, 1], loops])
    order = np.argsort(dst, kind="stable")
    return src[order], np.bincount(dst, minlength=n)


#: The clock of every timing: wall time, or with ``--cpu-time`` this thread's CPU time
#: (``time.thread_time``: other processes on a loaded machine then cost little; only
#: meaningful with ``--threads 1``).
clock = time.perf_counter


def time_methods(methods: dict, make_input, reps: int, warmup: int = 2) -> dict[str, tuple[float, ...]]:
    """Median forward, median backward, min forward, min backward seconds of each
    ``fn(x) -> y``; interleaved round-robin. (The minima show the uncontended cost on
    a shared machine; the medians are what a loop sees.)"""
    x = make_input().requires_grad_()
    with torch.no_grad():
        grads = {name: torch.randn_like(fn(x)) for name, fn in methods.items()}
    times = {name: ([], []) for name in methods}
    for rep in range(warmup + reps):
        for name, fn in methods.items():
            t0 = clock()
            y = fn(x)
            t1 = clock()
            torch.autograd.grad(y, x, grads[name])
            t2 = clock()
            del y
            if rep >= warmup:
                times[name][0].append(t1 - t0)
                times[name][1].append(t2 - t1)
    return {name: (statistics.median(f), statistics.median(b), min(f), min(b)) for name, (f, b) in times.items()}


def torch_only(fn):
    """``fn`` with neurovec's C++ kernels switched off while it runs (its backward then
    is the torch one too: the autograd node is chosen in the forward)."""
    def call(x):
        with native.disabled():
            return fn(x)
    return call


def inductor(fn):
    """``fn`` compiled by torch.compile's default backend (inductor's generated C++ loops)."""
    return torch.compile(fn, fullgraph=True, dynamic=False)


def segment_methods(reduce: str, seg: K.Segments) -> dict:
    ptr, seg_id, counts, n = seg.ptr, seg.seg_id, seg.counts, seg.n_segments
    m = {"neurovec segment (auto)": lambda x: K.segment_reduce(x, ptr, seg_id, counts, reduce),
         "neurovec segment, C++ off": torch_only(lambda x: K.segment_reduce(x, ptr, seg_id, counts, reduce))}
    base = "sum" if reduce == "mean" else reduce
    for impl in ("spmm", "segment_reduce", "scatter_reduce", "torch_scatter"):
        if base in K._IMPL_REDUCTIONS[impl] and (impl != "torch_scatter" or K.HAS_TORCH_SCATTER):
            m[f"  neurovec fwd={impl}"] = (
                lambda x, impl=impl: K.segment_reduce(x, ptr, seg_id, counts, reduce, impl=impl))
    if K.HAS_TORCH_SCATTER and reduce != "prod":
        import torch_scatter
        m["torch_scatter.segment_csr"] = lambda x: torch_scatter.segment_csr(x, ptr, reduce=reduce)
    m["torch scatter_reduce"] = lambda x: K.scatter_reduce_native(x, seg_id, n, reduce, counts)
    if reduce in ("sum", "mean"):
        def index_add(x):
            out = x.new_zeros((n,) + x.shape[1:]).index_add(0, seg_id, x)
            return out if reduce == "sum" else out / counts.view(-1, 1)
        m["torch index_add"] = index_add
        m["inductor: index_add"] = inductor(index_add)
    else:
        m["inductor: scatter_reduce"] = inductor(lambda x: K.scatter_reduce_native(x, seg_id, n, reduce, counts))
    m["torch.segment_reduce"] = lambda x: torch.segment_reduce(x, reduce, offsets=ptr, unsafe=True)
    return m


def gather_methods(gs: K.GatherSum, seg: K.Segments) -> dict:
    """Each method computes ``y[j] = sum_e values[e] * x[index[e]]`` (GCN's per-edge coefficients)."""
    ptr, seg_id, counts, n, index = seg.ptr, seg.seg_id, seg.counts, seg.n_segments, gs.index.long()
    v = gs.values.view(-1, 1)

    def index_add(x):
        return x.new_zeros((n,) + x.shape[1:]).index_add(0, seg_id, x.index_select(0, index) * v)

    m = {
        "GatherSum (auto: C++)": lambda x: gs(x),
        "GatherSum, C++ off (MKL sparse CSR mm)": torch_only(lambda x: gs(x)),
        "inductor: index_select * c + index_add": inductor(index_add),
        "index_select * c + neurovec segment sum": lambda x: K.segment_reduce(x.index_select(0, index) * v, ptr,
                                                                              seg_id, counts, "sum"),
        "index_select * c + torch index_add": index_add,
        "index_select * c + torch scatter_reduce": lambda x: K.scatter_reduce_native(
            x.index_select(0, index) * v, seg_id, n, "sum"),
    }
    if K.HAS_TORCH_SCATTER:
        import torch_scatter
        m["index_select * c + torch_scatter.segment_csr"] = lambda x: torch_scatter.segment_csr(
            x.index_select(0, index) * v, ptr, reduce="sum")
    return m


def print_table(title: str, results: dict[str, tuple[float, ...]], baseline: str):
    bf, bb = results[baseline][:2]
    print(f"\n{title}")
    print(f"  {'method':<42} {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} {'fwd x':>6} {'bwd x':>6}"
          f"  {'min fwd':>8} {'min bwd':>8}")
    for name, (f, b, fmin, bmin) in results.items():
        print(f"  {name:<42} {f * 1e3:8.2f} {b * 1e3:8.2f} {(f + b) * 1e3:8.2f} {bf / f:6.2f} {bb / b:6.2f}"
              f"  {fmin * 1e3:8.2f} {bmin * 1e3:8.2f}")
    sys.stdout.flush()


def run_proteins(args):
    src, counts = proteins_layer(args.data)
    seg = K.Segments.from_counts(counts, dtype=args.dtype)
    deg = counts.astype(np.float64)  # GCN's normalisation 1/sqrt(deg_i deg_j), as per-edge values
    gs = K.GatherSum.from_index(src, counts, len(counts), 1 / np.sqrt(np.repeat(deg, counts) * deg[src]),
                                dtype=args.dtype)
    e, n = seg.n_edges, seg.n_segments
    print(f"PROTEINS GCN layer: {n} segments (nodes), {e} edges incl. self-loops, "
          f"counts {counts.min()}..{counts.max()} (mean {counts.mean():.2f}); {args.dtype}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"torch_scatter {'yes' if K.HAS_TORCH_SCATTER else 'no'}, reps {args.reps}")
    print("fwd/bwd/f+b: medians; 'fwd x' / 'bwd x': median speed-up over the torch scatter_reduce row "
          "(>1 is faster); min: fastest repetition")
    gen = torch.Generator().manual_seed(0)
    for dim in args.dims:
        torch._dynamo.reset()  # inductor rows: a fresh compile per width (no recompile limit)
        for reduce in args.reduce:
            # Rounded values make ties common in max/min, as after a ReLU; away from 0 for prod.
            make = (lambda: (torch.rand((e, dim), generator=gen, dtype=args.dtype) * 4).round() / 4 + 0.5)
            res = time_methods(segment_methods(reduce, seg), make, args.reps)
            print_table(f"segment {reduce}, F = {dim}: (E, F) -> (S, F)", res, "torch scatter_reduce")
        if args.gather:
            res = time_methods(gather_methods(gs, seg),
                               lambda: torch.randn((n, dim), generator=gen, dtype=args.dtype), args.reps)
            print_table(f"gather * coefficient + sum, F = {dim}: (N, F) -> (S, F)", res,
                        "index_select * c + torch scatter_reduce")


def run_sweep(args):
    """Forward kernels across sizes (for the auto thresholds) and the small-layer costs."""
    _, degrees = proteins_layer(args.data)
    rng = np.random.default_rng(0)
    print(f"forward-kernel sweep, median µs, {args.dtype}, {torch.get_num_threads()} threads "
          f"(counts drawn from PROTEINS in-degrees + 1)")
    impls = ["spmm", "segment_reduce", "scatter_reduce"] + (["torch_scatter"] if K.HAS_TORCH_SCATTER
                                                                         else [])
    for reduce in ("sum", "max", "prod"):
        cols = [i for i in impls if reduce in K._IMPL_REDUCTIONS[i]]
        print(f"\n{reduce}: {'S':>6} {'E':>7} {'F':>3}  " + " ".join(f"{c:>14}" for c in cols) + "   auto picks")
        for s in (200, 5000, 43471):
            counts = rng.choice(degrees, s) + 1
            seg = K.Segments.from_counts(counts, dtype=args.dtype)
            for f in (1, 4, 8, 16, 32, 64):
                x = torch.randn((seg.n_edges, f), dtype=args.dtype)
                with torch.no_grad():
                    fns = {c: (lambda t, c=c: K.segment_forward(t, seg.ptr, seg.seg_id, reduce, c)) for c in cols}
                    us = _time_forward(fns, x, budget=0.25 if s > 10000 else 0.08)
                pick = K._auto_impl(x, reduce, True)
                print(f"   {s:>6} {seg.n_edges:>7} {f:>3}  " + " ".join(f"{us[c]:14.1f}" for c in cols) + f"   {pick}")
    print("\nsmall layers, forward + backward µs: custom-Function segment vs plain-torch scatter vs dense")
    for s, k, f in ((20, 3, 1), (200, 3, 4), (2000, 3, 16), (20000, 3, 32)):
        seg = K.Segments.from_counts(np.full(s, k), dtype=args.dtype)
        for reduce in ("sum", "max"):
            methods = {
                "segment": lambda x: K.segment_reduce(x, seg.ptr, seg.seg_id, seg.counts, reduce),
                "scatter": lambda x: K.scatter_reduce_native(x, seg.seg_id, s, reduce, seg.counts),
                "dense": lambda x: K.dense_reduce(x, k, reduce),
            }
            res = time_methods(methods, lambda: torch.randn((s * k, f), dtype=args.dtype), max(args.reps, 30))
            print(f"   S={s:>6} k={k} F={f:>3} {reduce:>4}: " + "  ".join(
                f"{name} {(fw + bw) * 1e6:8.1f}" for name, (fw, bw, _, _) in res.items()))


def _time_forward(fns: dict, x: torch.Tensor, budget: float) -> dict[str, float]:
    for fn in fns.values():
        fn(x)
    t0 = time.perf_counter()
    for fn in fns.values():
        fn(x)
    reps = int(min(200, max(5, budget / max(time.perf_counter() - t0, 1e-6))))
    times = {c: [] for c in fns}
    for _ in range(reps):
        for c, fn in fns.items():
            t = time.perf_counter()
            fn(x)
            times[c].append(time.perf_counter() - t)
    return {c: statistics.median(v) * 1e6 for c, v in times.items()}


def keep_freed_memory():
    """Stop glibc from returning big blocks to the OS (this process only)."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, (1 << 31) - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[3, 16, 32])
    parser.add_argument("--reduce", nargs="+", default=["sum", "mean", "max", "prod"], choices=K.REDUCTIONS)
    parser.add_argument("--no-gather", dest="gather", action="store_false", help="skip the gather + sum table")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", type=lambda s: getattr(torch, s), default=torch.float32)
    parser.add_argument("--data", type=Path, default=DATA, help="PROTEINS_A.txt")
    parser.add_argument("--sweep", action="store_true", help="size sweep behind choose_kernel instead")
    parser.add_argument("--malloc-keep", action="store_true", help="keep freed memory (no page-fault cost)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with this thread's CPU time (a loaded machine; --threads 1 only)")
    args = parser.parse_args()
    if args.cpu_time:
        global clock
        clock = time.thread_time
    torch.set_num_threads(args.threads)
    if args.malloc_keep:
        keep_freed_memory()
    (run_sweep if args.sweep else run_proteins)(args)


if __name__ == "__main__":
    main()
