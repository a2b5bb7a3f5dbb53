"""SDD circuits (neurovec.sources.circuits): reading, folding constants, exact weighted model counts.

Oracles: pysdd's own WMC manager on the same files (optional extra), brute-force
enumeration of the models of the CNF a random circuit was compiled from (needs
nothing), and the neuron-by-neuron reference engine.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import neurovec
from neurovec.datasets import circuits as random_circuits
from neurovec.sources import circuits
from neurovec.sources.circuits import AND, LITERAL, OR, CircuitError

SHARED = ("sudoku_4", "road_r", "4-grid")


def pysdd_wmc(sdd_path: Path, probabilities: np.ndarray, log: bool = False) -> np.ndarray:
    """pysdd's WMC of the file, one batch row at a time: w(v) = p, w(-v) = 1 - p."""
    sdd = pytest.importorskip("pysdd.sdd")
    vtree = sdd.Vtree.from_file(str(sdd_path.with_suffix(".vtree")).encode())
    manager = sdd.SddManager.from_vtree(vtree)
    root = manager.read_sdd_file(str(sdd_path).encode())
    counts = []
    for row in probabilities:
        wmc = root.wmc(log_mode=log)
        for v, p in enumerate(row.tolist(), 1):
            if v <= manager.var_count():
                wmc.set_literal_weight(v, np.log(p) if log else p)
                wmc.set_literal_weight(-v, np.log1p(-p) if log else 1 - p)
        counts.append(wmc.propagate())
    return np.array(counts)


def brute_force_wmc(clauses: np.ndarray, n_vars: int, probabilities: np.ndarray) -> np.ndarray:
    """Sum over the CNF's models of the product of literal weights: no SDD involved."""
    assignments = np.array(list(itertools.product([False, True], repeat=n_vars)), bool)  # (2^n, n)
    value = assignments[:, np.abs(clauses) - 1]                                           # (2^n, m, k)
    satisfied = np.where(clauses > 0, value, ~value).any(axis=2).all(axis=1)
    models = assignments[satisfied]
    weights = np.where(models[None], probabilities[:, None], 1 - probabilities[:, None])  # (batch, models, n)
    return weights.prod(axis=2).sum(axis=1)


def module_wmc(circuit, probabilities: np.ndarray, semiring="real", preset="default") -> torch.Tensor:
    module = circuits.compile(circuit, probabilities.shape[0], semiring, preset, dtype=torch.float64)
    x = torch.tensor(probabilities)
    return module(x.log() if semiring == "log" else x)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


VTREE_2 = "vtree 3\nL 1 1\nL 2 2\nI 0 1 2\n"


# -- the shared circuits --------------------------------------------------------------------------


@pytest.mark.parametrize("name, n_vars", [("sudoku_4", 64), ("road_r", 41), ("4-grid", 40)])
def test_reads_shared_circuits(circuits_dir, name, n_vars):
    circuit = circuits.read_sdd(circuits_dir / f"{name}.sdd")
    assert circuit.n_vars == n_vars
    kinds = np.bincount(circuit.kind, minlength=4)
    assert kinds[LITERAL] == circuit.n_literals > 0 and kinds[AND] > 0 and kinds[OR] > 0
    counts = np.diff(circuit.ptr)
    assert np.all(counts[circuit.kind == AND] == 2) and np.all(counts[circuit.kind == OR] >= 2)
    assert np.all(circuit.children < np.repeat(np.arange(circuit.n_nodes), counts))  # children first
    assert circuit.level[circuit.root] == circuit.depth


@pytest.mark.parametrize("semiring", circuits.SEMIRINGS)
@pytest.mark.parametrize("name", ["sudoku_4", "4-grid", "road_r"])
def test_shared_circuits_equal_pysdd(circuits_dir, name, semiring):
    path = circuits_dir / f"{name}.sdd"
    circuit = circuits.read_sdd(path)
    probabilities = np.random.default_rng(1).uniform(0.05, 0.95, (3, circuit.n_vars))
    expected = pysdd_wmc(path, probabilities, log=semiring == "log")
    got = module_wmc(circuit, probabilities, semiring).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("name", ["sudoku_4", "4-grid"])
def test_log_semiring_at_probabilities_zero_and_one(circuits_dir, name):
    """Log-weights of exactly log 0 = -inf and log 1 = 0 give the log of the real WMC: a logsumexp whose
    children are all -inf is -inf (its max reads a finite floor), not NaN (-inf - -inf) as it was
    before. (Gradients there may be NaN: docs/circuits.md, "Not done yet".)"""
    circuit = circuits.read_sdd(circuits_dir / f"{name}.sdd")
    p = np.random.default_rng(4).uniform(0.05, 0.95, (4, circuit.n_vars))
    p[1, ::3] = 0.0
    p[2, ::2] = 1.0
    p[3, :2], p[3, 2:4] = 0.0, 1.0
    real = module_wmc(circuit, p, "real").numpy()
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(module_wmc(circuit, p, "log").numpy(), np.log(real), rtol=1e-12, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("semiring", circuits.SEMIRINGS)
@pytest.mark.parametrize("name", SHARED)
def test_shared_circuits_every_preset(circuits_dir, name, semiring):
    path = circuits_dir / f"{name}.sdd"
    circuit = circuits.read_sdd(path)
    probabilities = np.random.default_rng(2).uniform(0.05, 0.95, (2, circuit.n_vars))
    expected = pysdd_wmc(path, probabilities, log=semiring == "log")
    for preset in neurovec.list_presets():
        got = module_wmc(circuit, probabilities, semiring, preset).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0, err_msg=preset)


def test_shared_circuit_equals_klay(circuits_dir):
    klay = pytest.importorskip("klay")
    path = circuits_dir / "sudoku_4.sdd"
    circuit = circuits.read_sdd(path)
    probabilities = np.random.default_rng(3).uniform(0.05, 0.95, (4, circuit.n_vars))
    reference = klay.Circuit()
    reference.add_sdd_from_file(str(path))
    for semiring in circuits.SEMIRINGS:
        theirs = reference.to_torch_module(semiring=semiring, compile=False)
        x = torch.tensor(probabilities)
        expected = theirs(x.log() if semiring == "log" else x).reshape(-1).numpy()
        np.testing.assert_allclose(module_wmc(circuit, probabilities, semiring).numpy(), expected, rtol=1e-9)


def test_gradients_equal_finite_differences(circuits_dir):
    """The WMC is multilinear in each p, so central differences are exact up to rounding; the
    log semiring's gradient is the real one times p / WMC."""
    circuit = circuits.read_sdd(circuits_dir / "sudoku_4.sdd")
    p = np.random.default_rng(4).uniform(0.1, 0.9, (2, circuit.n_vars))
    x = torch.tensor(p, requires_grad=True)
    module = circuits.compile(circuit, 2, "real", dtype=torch.float64)
    wmc = module(x)
    wmc.sum().backward()
    h = 1e-3
    for v in (0, 17, 45, 63):
        up, down = p.copy(), p.copy()
        up[:, v] += h
        down[:, v] -= h
        with torch.no_grad():
            fd = (module(torch.tensor(up)) - module(torch.tensor(down))) / (2 * h)
        np.testing.assert_allclose(x.grad[:, v].numpy(), fd.numpy(), rtol=1e-6)
    log_x = torch.tensor(np.log(p), requires_grad=True)
    log_module = circuits.compile(circuit, 2, "log", dtype=torch.float64)
    log_wmc = log_module(log_x)
    log_wmc.sum().backward()
    np.testing.assert_allclose(log_wmc.detach().numpy(), np.log(wmc.detach().numpy()), rtol=1e-12)
    expected = x.grad.numpy() * p / wmc.detach().numpy()[:, None]
    np.testing.assert_allclose(log_x.grad.numpy(), expected, rtol=1e-9, atol=1e-300)


def test_gradcheck_small_circuit(tmp_path):
    path = write(tmp_path, "xor.sdd", "sdd 5\nL 1 1 1\nL 2 2 2\nL 3 1 -1\nL 4 2 -2\nD 0 0 2 1 4 3 2\n")
    write(tmp_path, "xor.vtree", VTREE_2)
    circuit = circuits.read_sdd(path)
    for semiring in circuits.SEMIRINGS:
        module = circuits.compile(circuit, 3, semiring, dtype=torch.float64)
        x = torch.tensor(np.random.default_rng(5).uniform(0.1, 0.9, (3, 2)))
        x = (x.log() if semiring == "log" else x).requires_grad_()
        assert torch.autograd.gradcheck(module, (x,))


def test_compiled_equals_reference_engine(circuits_dir):
    circuit = circuits.read_sdd(circuits_dir / "road_r.sdd")
    rng = np.random.default_rng(6)
    for semiring in circuits.SEMIRINGS:
        values = rng.uniform(0.05, 0.95, (circuit.n_vars, 2))
        values = np.log(values) if semiring == "log" else values
        graph = circuits.to_graph(circuit, 2, semiring, literal_weights=values)
        reference = neurovec.ReferenceModule(graph)()
        for preset in ("default", "unoptimized"):
            compiled = neurovec.compile(graph, circuits.settings(preset), torch.float64)()
            torch.testing.assert_close(compiled, reference, rtol=1e-12, atol=0, msg=lambda m: f"{preset}: {m}")


# -- random circuits: pysdd compiles random CNFs --------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(n_vars=st.integers(2, 6), n_clauses=st.integers(1, 9), width=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16), batch=st.integers(1, 3), semiring=st.sampled_from(circuits.SEMIRINGS))
def test_random_circuits_equal_enumeration_and_pysdd(tmp_path_factory, n_vars, n_clauses, width, seed, batch,
                                                     semiring):
    pytest.importorskip("pysdd")
    width = min(width, n_vars)
    clauses = random_circuits.random_cnf(n_vars, n_clauses, width, seed)
    path = random_circuits.compile_cnf(clauses, n_vars, tmp_path_factory.mktemp("cnf") / "f.sdd")
    circuit = circuits.read_sdd(path)
    p = np.random.default_rng(seed).uniform(0.05, 0.95, (batch, n_vars))
    expected = brute_force_wmc(clauses, n_vars, p)
    np.testing.assert_allclose(pysdd_wmc(path, p), expected, rtol=1e-12, atol=1e-300)
    got = module_wmc(circuit, p, semiring).numpy()
    np.testing.assert_allclose(np.exp(got) if semiring == "log" else got, expected, rtol=1e-9, atol=1e-300)


@pytest.fixture(scope="module")
def small_random(tmp_path_factory):
    pytest.importorskip("pysdd")
    clauses = random_circuits.random_cnf(8, 12, 3, seed=11)
    path = random_circuits.compile_cnf(clauses, 8, tmp_path_factory.mktemp("cnf") / "r8.sdd")
    return clauses, path


@pytest.mark.parametrize("semiring", circuits.SEMIRINGS)
def test_every_preset_on_a_random_circuit(small_random, semiring):
    clauses, path = small_random
    circuit = circuits.read_sdd(path)
    p = np.random.default_rng(7).uniform(0.05, 0.95, (2, 8))
    expected = brute_force_wmc(clauses, 8, p)
    expected = np.log(expected) if semiring == "log" else expected
    for preset in neurovec.list_presets():
        np.testing.assert_allclose(module_wmc(circuit, p, semiring, preset).numpy(), expected, rtol=1e-9,
                                   err_msg=preset)


def test_random_cnf_is_seeded():
    a = random_circuits.random_cnf(10, 20, 3, seed=5)
    assert a.shape == (20, 3) and np.array_equal(a, random_circuits.random_cnf(10, 20, 3, seed=5))
    assert not np.array_equal(a, random_circuits.random_cnf(10, 20, 3, seed=6))
    variables = np.sort(np.abs(a), axis=1)
    assert np.all(variables[:, 1:] != variables[:, :-1]) and variables.min() >= 1 and variables.max() <= 10


# -- constants and small hand-written circuits -----------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("sdd 1\nT 0\n", lambda p: np.ones(len(p))),
    ("sdd 1\nF 0\n", lambda p: np.zeros(len(p))),
    ("sdd 1\nL 0 2 -2\n", lambda p: 1 - p[:, 1]),
    # x1 AND T, -x1 AND F: folds to the literal x1
    ("sdd 5\nL 1 1 1\nT 2\nL 3 1 -1\nF 4\nD 0 0 2 1 2 3 4\n", lambda p: p[:, 0]),
    # x1 xor x2
    ("sdd 5\nL 1 1 1\nL 2 2 2\nL 3 1 -1\nL 4 2 -2\nD 0 0 2 1 4 3 2\n",
     lambda p: p[:, 0] * (1 - p[:, 1]) + (1 - p[:, 0]) * p[:, 1]),
    # a true element beside a product: the sum reads the constant
    ("sdd 4\nL 1 1 1\nL 2 2 2\nT 3\nD 0 0 2 1 2 3 3\n", lambda p: p[:, 0] * p[:, 1] + 1),
    # every element false: the decision is false
    ("sdd 4\nL 1 1 1\nF 2\nL 3 1 -1\nD 0 0 2 1 2 3 2\n", lambda p: np.zeros(len(p))),
])
@pytest.mark.parametrize("semiring", circuits.SEMIRINGS)
def test_constants_fold_exactly(tmp_path, text, expected, semiring):
    write(tmp_path, "c.vtree", VTREE_2)
    circuit = circuits.read_sdd(write(tmp_path, "c.sdd", text))
    p = np.array([[0.3, 0.6], [0.9, 0.2]])
    got = module_wmc(circuit, p, semiring).numpy()
    with np.errstate(divide="ignore"):
        want = np.log(expected(p)) if semiring == "log" else expected(p)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.all(np.isin(circuit.kind[circuit.n_literals:], [circuits.TRUE, AND, OR]))


def test_comments_blank_lines_and_no_vtree(tmp_path):
    text = "c a comment with numbers 1 2 3\n\nsdd 3\nc another\nL 1 1 1\n  L 2 2 -2  \n\nD 0 0 1 1 2\n"
    circuit = circuits.read_sdd(write(tmp_path, "n.sdd", text), vtree=None)
    assert circuit.n_vars == 2 and circuit.root >= 0 and circuit.kind[circuit.root] == AND
    np.testing.assert_allclose(module_wmc(circuit, np.array([[0.3, 0.6]])).numpy(), [0.3 * 0.4])


def test_module_checks_the_weights_shape(tmp_path):
    write(tmp_path, "c.vtree", VTREE_2)
    circuit = circuits.read_sdd(write(tmp_path, "c.sdd", "sdd 1\nL 0 1 1\n"))
    module = circuits.compile(circuit, 2, dtype=torch.float64)
    with pytest.raises(neurovec.GraphError, match=r"expected shape \(batch, n_vars\) = \(2, 2\).*\(3, 2\)"):
        module(torch.rand(3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown semiring 'tropical'"):
        circuits.to_graph(circuit, 2, "tropical")
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        circuits.to_graph(circuit, 0)


def test_graph_layers(circuits_dir):
    circuit = circuits.read_sdd(circuits_dir / "4-grid.sdd")
    graph = circuits.to_graph(circuit, 5)
    names = [layer.name for layer in graph.layers]
    assert names[:2] == ["literals", "negations"] and graph.layer("literals").values.shape == (40, 5)
    assert all(n.startswith(("and", "or")) for n in names[2:])
    assert {graph.layer(n).aggregation for n in names[2:]} == {"prod", "sum"}
    log_graph = circuits.to_graph(circuit, 5, "log")
    log_names = [layer.name for layer in log_graph.layers]
    if "logsumexp" in neurovec.sources.AGGREGATIONS:
        assert log_graph.layer("or2").aggregation == "logsumexp" and "or2.max" not in log_names
    else:  # built from max, exp, sum and log
        assert {"negations.exp", "or2.max", "or2.shift", "or2.sum", "or2"} <= set(log_names)


@pytest.mark.parametrize("semiring", circuits.SEMIRINGS)
@pytest.mark.parametrize("name", SHARED)
def test_every_layer_reads_the_layer_below(circuits_dir, name, semiring):
    """KLay-style layers: slot t reads slot t - 1 only (its own logsumexp parts aside), so the
    program gathers from one tensor per layer; long edges go through one-input copies."""
    circuit = circuits.read_sdd(circuits_dir / f"{name}.sdd")
    graph = circuits.to_graph(circuit, 2, semiring)
    slot = circuits.schedule(circuit)
    inner = circuit.kind >= AND
    assert np.all(slot[circuit.kind == LITERAL] == 0)
    assert np.all(slot[inner & (circuit.kind == AND)] % 2 == 1) and np.all(slot[inner & (circuit.kind == OR)] % 2 == 0)
    owner = np.repeat(np.arange(circuit.n_nodes), np.diff(circuit.ptr))
    assert np.all(slot[circuit.children] < slot[owner])
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    below = {0: {index[n] for n in ("literals", "negations", "constants") if n in index}}
    copies = 0
    for t in range(1, int(slot.max()) + 1):
        layer = graph.layer(f"{'or' if t % 2 == 0 else 'and'}{t}")
        own = {i for n, i in index.items() if n.startswith(f"{layer.name}.")}
        assert set(np.unique(layer.input_layer).tolist()) <= below[t - 1] | own, layer.name
        for part in own:  # a logsumexp's parts read the slot below, each other and the floor constant
            allowed = below[t - 1] | own | ({index["log_floor"]} if "log_floor" in index else set())
            assert set(np.unique(graph.layers[part].input_layer).tolist()) <= allowed, graph.layers[part].name
        real = int(np.sum(inner & (slot == t)))
        assert np.all(layer.counts[real:] == 1)  # the copies
        copies += layer.size - real
        below[t] = {index[layer.name]}
    assert copies > 0  # the shared circuits have long edges


# -- bad input: errors name the file and the line ---------------------------------------------------


def bad(tmp_path, text, *patterns, vtree=VTREE_2, name="bad.sdd"):
    if vtree is not None:
        write(tmp_path, Path(name).with_suffix(".vtree").name, vtree)
    path = write(tmp_path, name, text)
    with pytest.raises(CircuitError) as error:
        circuits.read_sdd(path)
    message = str(error.value)
    assert message.startswith(str(path)), message
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_truncated_files(circuits_dir, tmp_path):
    text = (circuits_dir / "sudoku_4.sdd").read_text()
    lines = text.splitlines(keepends=True)
    # Cut inside the last line: the record is short.
    bad(tmp_path, "".join(lines[:-1]) + lines[-1][:9], f"line {len(lines)}", "needs 7 numbers, got 4",
        "truncated", vtree=(circuits_dir / "sudoku_4.vtree").read_text(), name="cut_line.sdd")
    # Cut at a line boundary: fewer nodes than the header declares.
    bad(tmp_path, "".join(lines[:500]), "truncated file?", "declares 869 SDD nodes but the file has",
        vtree=(circuits_dir / "sudoku_4.vtree").read_text(), name="cut_nodes.sdd")
    bad(tmp_path, "sdd 2\nL 1 1 1\nD 0 0 1 1", "line 3", "needs 5 numbers, got 4", "truncated")
    bad(tmp_path, "sdd 2\nL 1 1 1\nD 0", "line 3", "at least 3 numbers, got 1", "truncated")
    bad(tmp_path, "", "expected the header 'sdd COUNT'")


def test_undefined_and_later_references(tmp_path):
    bad(tmp_path, "sdd 2\nL 1 1 1\nD 0 0 1 1 7\n", "line 3", "references node 7 as a sub",
        "not defined in the file")
    bad(tmp_path, "sdd 3\nD 0 0 1 1 2\nL 1 1 1\nL 2 2 2\n", "line 2", "references node 1 as a prime",
        "defined later, on line 3")
    bad(tmp_path, "sdd 2\nL 1 1 1\nL 1 2 2\n", "line 3", "SDD node id 1 is defined again (first on line 2)")


def test_literals_outside_the_vtree(tmp_path):
    bad(tmp_path, "sdd 1\nL 0 1 5\n", "line 2", "literal 5: variable 5 is not in the vtree", "1..2")
    bad(tmp_path, "sdd 1\nL 0 2 -1\n", "line 2", "literal -1 is on vtree node 2", "leaf", "is vtree node 1")
    bad(tmp_path, "sdd 1\nL 0 9 1\n", "line 2", "vtree node 9", "does not have")
    bad(tmp_path, "sdd 1\nL 0 1 0\n", "line 2", "literal 0")
    bad(tmp_path, "sdd 2\nL 1 1 1\nD 0 1 1 1 1\n", "line 3", "vtree node 1, a leaf")


def test_malformed_records(tmp_path):
    bad(tmp_path, "sdd 1\nX 0\n", "line 2", "unknown record 'X'")
    bad(tmp_path, "sdd 1\nL 0 1 x1\n", "line 2", "'x1' is not an integer")
    bad(tmp_path, "sdd 1\nL 0 1 -\n", "line 2", "'-' is not an integer")
    bad(tmp_path, "sdd 1\nL 0 1 99999999999999999999\n", "line 2", "beyond the int64 range")
    bad(tmp_path, "sdd 1\nL 0 1 1 4\n", "line 2", "needs 3 numbers, got 4")
    bad(tmp_path, "sdd 1\nD 0 0 0\n", "line 2", "declares 0 elements")
    bad(tmp_path, "sdd 1\nL 0 1 1\nL 2 2 2\n", "line 3", "more SDD nodes than the 1")
    bad(tmp_path, "L 0 1 1\n", "line 1", "expected the header")
    bad(tmp_path, "sdd 1\nsdd 1\nL 0 1 1\n", "line 2", "a second 'sdd' header")
    bad(tmp_path, "sdd 1\nL -3 1 1\n", "line 2", "SDD node id -3 is negative")


def test_bad_vtrees(tmp_path):
    for text, patterns in [
        ("vtree 3\nL 1 1\nL 2 2\nI 0 1 5\n", ("line 4", "right child 5 which is not defined")),
        ("vtree 3\nI 0 1 2\nL 1 1\nL 2 2\n", ("line 2", "left child 1 which is defined later, on line 3")),
        ("vtree 2\nL 1 1\nL 2 1\n", ("line 3", "variable 1 has a second leaf (first on line 2)")),
        ("vtree 3\nL 1 1\nL 2 2\n", ("truncated file?", "declares 3 vtree nodes but the file has 2")),
        ("vtree 1\nL 1 0\n", ("line 2", "variable 0")),
    ]:
        path = write(tmp_path, "v.vtree", text)
        with pytest.raises(CircuitError) as error:
            circuits.read_vtree(path)
        assert str(error.value).startswith(str(path))
        for pattern in patterns:
            assert pattern in str(error.value), str(error.value)
    with pytest.raises(CircuitError, match="cannot read"):
        circuits.read_sdd(tmp_path / "missing.sdd")
