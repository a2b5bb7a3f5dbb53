"""Page faults and CPU time of a large gather sum (``python benchmarks/kernels_hugepages.py``).

NOTE: [huge pages for large outputs] in ``engines/native_ops.cpp``: the C++ kernels ask for
transparent huge pages for outputs of 8 MiB or more. This script times one sparse sum of
``arxiv-like``'s size (R-MAT, 169,343 nodes, 1.3M entries, ``--width`` features, random
per-edge values), forward and forward + backward, and counts the minor page faults of each
call (``getrusage``). Run it at two commits (``PYTHONPATH`` and ``NEUROVEC_CACHE_DIR`` of each)
to compare; CPU time, medians of ``--reps``.
"""
from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from neurovec.datasets.synthetic import rmat_dataset
from neurovec.engines import kernels, native, runtime


def measure(fn, reps: int) -> tuple[float, int]:
    fn()
    times, faults = [], []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return float(np.median(times)) * 1e3, int(np.median(faults))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = rmat_dataset("arxiv-like", seed=0)
    src, dst = data.edge_index
    order = np.argsort(dst, kind="stable")
    counts = np.bincount(dst, minlength=data.n_nodes)
    rng = np.random.default_rng(0)
    csr = runtime.CSRIndices(kernels.GatherSum.from_index(src[order], counts[counts > 0], data.n_nodes,
                                                          values=rng.random(src.size), dtype=torch.float32))
    x = torch.randn(data.n_nodes, args.width, requires_grad=True)
    grad = torch.ones(int((counts > 0).sum()), args.width)

    def forward():
        with torch.no_grad():
            runtime.gather_sum(x, csr)

    def forward_backward():
        x.grad = None
        runtime.gather_sum(x, csr).backward(grad)

    print(f"arxiv-like gather sum: {int((counts > 0).sum())} rows from {src.size} entries, width {args.width}, "
          f"{args.threads} thread(s), C++ kernels {'on' if native.available() else 'off'}")
    for name, fn in (("forward", forward), ("forward + backward", forward_backward)):
        ms, faults = measure(fn, args.reps)
        print(f"  {name:<20} {ms:8.1f} CPU ms  {faults:7d} minor page faults a call")


if __name__ == "__main__":
    main()
