"""Random arithmetic circuits: seeded random CNFs compiled to SDD files with ``pysdd``.

    from neurovec.datasets import circuits as random_circuits
    path = random_circuits.random_sdd(n_vars=30, n_clauses=60, seed=0, directory="circuits")
    circuit = neurovec.sources.circuits.read_sdd(path)          # path.with_suffix(".vtree") beside it

A CNF of ``n_clauses`` clauses, each of ``width`` distinct variables drawn uniformly
with random signs (numpy's ``default_rng(seed)``: the same CNF on every machine), is
conjoined clause by clause into an SDD over a ``balanced`` (or ``right``, ``left``, ...)
vtree, with pysdd's automatic garbage collection and minimization off so that the
circuit depends on the CNF and the vtree only. Sizes grow steeply with the variables
and shrink again past the satisfiability threshold (about 4.27 clauses per variable
for 3-CNFs); :data:`BENCHMARK_CNFS` lists the ones the benchmark uses, from about
10^4 to about 10^6 circuit nodes.

``pysdd`` is an optional dependency (``pip install pysdd``): this module imports
without it and :func:`compile_cnf` raises ``ImportError`` with the install line.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["BENCHMARK_CNFS", "random_cnf", "compile_cnf", "random_sdd", "sdd_manager"]

#: name -> (n_vars, n_clauses, width, seed): random 3-CNFs whose balanced-vtree SDDs
#: have about 10^4, 10^5, 3x10^5 and 10^6 circuit nodes (literals, products and sums
#: after folding constants; :func:`neurovec.sources.circuits.read_sdd`).
BENCHMARK_CNFS: dict[str, tuple[int, int, int, int]] = {
    "cnf-30": (30, 60, 3, 0),
    "cnf-36": (36, 72, 3, 0),
    "cnf-40": (40, 60, 3, 0),
    "cnf-44": (44, 66, 3, 0),
}


def random_cnf(n_vars: int, n_clauses: int, width: int = 3, seed: int = 0) -> np.ndarray:
    """``(n_clauses, width)`` signed literals: each clause has ``width`` distinct variables
    of ``1..n_vars`` (uniformly), each negated with probability 1/2."""
    if not 1 <= width <= n_vars:
        raise ValueError(f"width must be between 1 and n_vars (got width {width}, n_vars {n_vars})")
    rng = np.random.default_rng(seed)
    # Distinct variables per clause: the first `width` of a random permutation, row by row.
    variables = np.argsort(rng.random((n_clauses, n_vars)), axis=1)[:, :width] + 1
    signs = np.where(rng.random((n_clauses, width)) < 0.5, -1, 1)
    return (variables * signs).astype(np.int64)


def _pysdd():
    try:
        from pysdd.sdd import SddManager, Vtree
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError("random circuits need pysdd: pip install pysdd") from error
    return SddManager, Vtree


def sdd_manager(clauses: np.ndarray, n_vars: int, vtree: str = "balanced"):
    """Conjoin the clauses in a fresh pysdd manager: ``(manager, root)``."""
    SddManager, Vtree = _pysdd()
    manager = SddManager.from_vtree(Vtree(var_count=n_vars, vtree_type=vtree))
    manager.auto_gc_and_minimize_off()
    root = manager.true()
    for clause in np.asarray(clauses).tolist():
        disjunction = manager.false()
        for literal in clause:
            disjunction = manager.disjoin(disjunction, manager.literal(int(literal)))
        root = manager.conjoin(root, disjunction)
    return manager, root


def compile_cnf(clauses: np.ndarray, n_vars: int, path, vtree: str = "balanced") -> Path:
    """Compile the CNF with pysdd and write ``path`` (``.sdd``) and the vtree beside it (``.vtree``)."""
    manager, root = sdd_manager(clauses, n_vars, vtree)
    path = Path(path).with_suffix(".sdd")
    path.parent.mkdir(parents=True, exist_ok=True)
    root.save(os.fsencode(path))
    manager.vtree().save(os.fsencode(path.with_suffix(".vtree")))
    return path


def random_sdd(n_vars: int, n_clauses: int, width: int = 3, seed: int = 0, directory=".",
               vtree: str = "balanced") -> Path:
    """A random CNF (:func:`random_cnf`) compiled into ``directory``; an existing file of the
    same parameters is reused (the name holds them all)."""
    path = Path(directory) / f"cnf-v{n_vars}-c{n_clauses}-w{width}-s{seed}-{vtree}.sdd"
    if not (path.is_file() and path.with_suffix(".vtree").is_file()):
        compile_cnf(random_cnf(n_vars, n_clauses, width, seed), n_vars, path, vtree)
    return path
