"""neurovec.relational against PyNeuraLogic 0.9.2: each template written once for neurovec, once for NeuraLogic.

Both are built with the same weights (explicit values, or NeuraLogic's initial values copied in template order:
rules in order, each with its head weight, body weights and offset, then the predicate offsets) on the same facts;
the grounded graph, compiled under ``default`` and ``unoptimized``, must give ``model.test`` to 1e-9 in float64.
NeuraLogic builds with ``chain_pruning=False, iso_value_compression=False``: its networks then compute the
template's function (chain pruning can change it, see docs/neuralogic.md). One JVM serves the session.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

neuralogic = pytest.importorskip("neuralogic", reason='PyNeuraLogic is not installed (pip install -e ".[neuralogic]")')
if shutil.which("java") is None:  # pragma: no cover
    pytest.skip("PyNeuraLogic needs a Java runtime and none is on the PATH", allow_module_level=True)

import neuralogic.logging  # noqa: E402
from neuralogic.core import Aggregation as NA  # noqa: E402
from neuralogic.core import Combination as NCo  # noqa: E402
from neuralogic.core import C as NC  # noqa: E402
from neuralogic.core import Metadata as NM  # noqa: E402
from neuralogic.core import Model, Settings  # noqa: E402
from neuralogic.core import R as NR  # noqa: E402
from neuralogic.core import Transformation as NT  # noqa: E402
from neuralogic.core import V as NV  # noqa: E402
from neuralogic.dataset import Data, Dataset, FileDataset, TensorDataset  # noqa: E402
from neuralogic.nn.module import GINConv, SAGEConv  # noqa: E402

import neurovec  # noqa: E402
from neurovec.engines.reference import ReferenceModule  # noqa: E402
from neurovec.sources.graph import Graph, Weight  # noqa: E402
from neurovec.sources.relational import (C, Query, R, Relation, Template, V, ground)  # noqa: E402
from neurovec.sources.relational import Aggregation, Combination, Metadata, Transformation  # noqa: E402

neuralogic.logging.clear_handlers()
DATA = Path(neuralogic.__file__).parent / "utils" / "data" / "datasets"


# -- helpers ------------------------------------------------------------------------------------------------------
def neuralogic_run(model, dataset, first: int | None = None):
    """NeuraLogic's outputs (samples in order) and its template weights, by weight index."""
    model.build(Settings(chain_pruning=False, iso_value_compression=False))
    built = model.build_dataset(dataset)
    if first is not None:
        built = built[:first]
    out = np.asarray(model.test(built), dtype=np.float64).reshape(len(built), -1)
    weights = sorted((int(w.index), w) for w in model._neural_model.getAllWeights() if int(w.index) >= 0)
    return out, [np.asarray(memoryview(w.value.getAsArray()), dtype=np.float64) for _, w in weights]


def with_weights(graph: Graph, values: list) -> Graph:
    """The graph with its first ``len(values)`` weights (the template's, in template order) set to ``values``."""
    weights = list(graph.weights)
    for k, value in enumerate(values):
        w = weights[k]
        assert value.size == w.value.size, f"weight {k} ({w.name}): NeuraLogic has {value.size} values, neurovec " \
                                           f"{w.value.size}: the templates differ"
        weights[k] = Weight(w.name, value.reshape(w.value.shape), w.learnable)
    return Graph(graph.layers, weights, graph.output_layer, graph.output_ordinal)


def assert_equal(template: Template, relations: dict, queries, model, dataset, first: int | None = None,
                 copy_weights: bool = True, presets=("default", "unoptimized")) -> Graph:
    expected, nl_weights = neuralogic_run(model, dataset, first)
    for prune in (True, False):
        graph = ground(template, relations, queries, prune=prune).graph
        if copy_weights:
            graph = with_weights(graph, nl_weights)
        if graph.n_neurons <= 5000:
            reference = ReferenceModule(graph, torch.float64)().detach().numpy()
            np.testing.assert_allclose(reference.reshape(expected.shape), expected, rtol=0, atol=1e-9)
        for preset in presets:
            got = neurovec.compile(graph, preset, dtype=torch.float64)().detach().numpy()
            np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=0, atol=1e-9,
                                       err_msg=f"{preset}, prune={prune}")
    return graph


def template_file(text: str, tmp_path, name: str = "template.txt") -> Model:
    path = tmp_path / name
    path.write_text(text)
    return Model(model_file=str(path))


_ATOM = re.compile(r"(?:<([^>]*)>|(-?\d+(?:\.\d+)?))?\s*(\w+)(?:\(([^)]*)\))?")


def _constant(text: str):
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def read_examples(examples: Path, queries: Path | None = None, first: int | None = None,
                  predicates=()) -> tuple[dict, list]:
    """NeuraLogic's example files as relations (one example per line; ``<v> head :- facts.`` lines too) and the
    queries of each line, as ``Query`` objects. ``predicates`` (``name/arity``) get a relation even when no
    example has facts of them."""
    rows: dict[str, list] = {}
    asked = []
    lines = [line.strip() for line in re.split(r"\.\s*(?:\n|$)", examples.read_text()) if line.strip()]
    query_lines = [line.strip() for line in re.split(r"\.\s*(?:\n|$)", queries.read_text()) if line.strip()] \
        if queries else None
    for e, line in enumerate(lines[:first]):
        if ":-" in line:
            line = line.split(":-", 1)[1]
        for value, number, name, args in _ATOM.findall(line.rstrip(".")):
            if not name:
                continue
            value = value or number
            value = None if value == "" else np.asarray(eval(value), dtype=np.float64)  # noqa: S307 (test data)
            terms = tuple(_constant(a) for a in args.split(",")) if args else ()
            rows.setdefault(f"{name}/{len(terms)}", []).append((e, terms, value))
    if query_lines is None:
        query_lines = [line.split(":-", 1)[0] for line in lines[:first]]
    for k, query in enumerate(query_lines[:first]):  # one example and many queries: all ask that example
        _, _, name, args = _ATOM.findall(query.strip().rstrip("."))[0]
        terms = [_constant(a) for a in args.split(",")] if args else []
        asked.append(Query(name, args=[[t] for t in terms] or None, example=[k if len(lines) > 1 else 0]))
    relations = {}
    for key, facts in rows.items():
        arity = len(facts[0][1])
        args = tuple(np.asarray([f[1][k] for f in facts]) for k in range(arity))
        values = None if all(f[2] is None for f in facts) else \
            np.stack([f[2] if f[2] is not None else np.float64(1.0) for f in facts])
        relations[key] = Relation(args, values=values, example=[f[0] for f in facts], size=len(facts))
    for key in predicates:
        if key not in relations:
            name, arity = key.rsplit("/", 1)
            relations[key] = Relation([np.zeros(0, np.int64)] * int(arity), example=np.zeros(0, np.int64), size=0)
    return relations, asked


@pytest.fixture(scope="module")
def mutag(tu_dir):
    from neurovec.datasets.tu import load_tu
    return load_tu("MUTAG", data_dir=tu_dir, download=False)


def tu_tensor_dataset(ds, graphs, norm: bool = False, feature: str = "node_feature", edge: str = "edge"):
    """The same graphs for NeuraLogic (node ids local to each graph, as TensorDataset numbers them)."""
    x = ds.node_features()
    data = []
    for g in graphs:
        nodes = np.flatnonzero(ds.graph_of_node == g)
        src, dst = ds.edge_index[:, ds.graph_of_node[ds.edge_index[0]] == g] - nodes[0]
        attr = None
        if norm:
            n = nodes.size
            src, dst = np.concatenate([src, np.arange(n)]), np.concatenate([dst, np.arange(n)])
            degree = np.bincount(dst, minlength=n)
            attr = (1.0 / np.sqrt(degree[src] * degree[dst])).tolist()
        data.append(Data(x=x[nodes].tolist(), edge_index=[src.tolist(), dst.tolist()], y=1.0, edge_attr=attr))
    return TensorDataset(data, feature_name=feature, edge_name=edge)


# -- thesis examples and constructs (quick) -----------------------------------------------------------------------
def test_thesis_figure_4_1(tmp_path):
    """W_h1 h(X) :- W_a a(Y), W_b b(X, Y).   W_q q :- W_h2 h(X).   (two molecules; a, b unit facts)."""
    text = ("{3,3} h(X) :- {3,1} a(Y), {3,1} b(X, Y). [transformation=sigmoid]\nh/1 [transformation=sigmoid]\n"
            "{1,3} q :- {3,3} h(X). [transformation=sigmoid]\nq/0 [transformation=sigmoid]\n")
    model = template_file(text, tmp_path)
    bonds = [[("h1", "o1"), ("o1", "h2")], [("h3", "h4")]]
    dataset = Dataset()
    for molecule in bonds:
        atoms = sorted({a for bond in molecule for a in bond})
        facts = [NR.a(a) for a in atoms] + [NR.b(x, y) for x, y in molecule] + [NR.b(y, x) for x, y in molecule]
        dataset.add(NR.q[1.0], facts)
    t = Template()
    t += (R.h(V.X)[3, 3] <= (R.a(V.Y)[3, 1], R.b(V.X, V.Y)[3, 1])) | Metadata(transformation=Transformation.SIGMOID)
    t += R.h / 1 | Metadata(transformation=Transformation.SIGMOID)
    t += (R.q[1, 3] <= R.h(V.X)[3, 3]) | Metadata(transformation=Transformation.SIGMOID)
    t += R.q / 0 | Metadata(transformation=Transformation.SIGMOID)
    x = [x for m, molecule in enumerate(bonds) for bond in molecule for x in (bond, bond[::-1])]
    example = [m for m, molecule in enumerate(bonds) for _ in molecule for _ in (0, 1)]
    atoms = [(a, m) for m, molecule in enumerate(bonds) for a in sorted({a for bond in molecule for a in bond})]
    relations = {"a": Relation([a for a, _ in atoms], example=[m for _, m in atoms]),
                 "b": Relation(([s for s, _ in x], [d for _, d in x]), example=example)}
    assert_equal(t, relations, R.q, model, dataset)


def test_recursion_of_varying_depth_thesis_figure_5_6():
    """reach/1 along chains of lengths 2, 5, 1 and 8: one level per step, aligned at the chains' starts."""
    rng = np.random.default_rng(1)
    w, e = rng.normal(size=(3, 3)).round(3), rng.normal(size=3).round(3)
    model = Model()
    model += NR.reach(NV.X)[e.tolist()] <= NR.start(NV.X)
    model += (NR.reach(NV.Y)[w.tolist()] <= (NR.reach(NV.X), NR.edge(NV.X, NV.Y))) | NM(transformation=NT.TANH)
    model += NR.reach / 1 | NM(transformation=NT.TANH)
    model += (NR.q[[[1.0, -1.0, 0.5]]] <= NR.reach(NV.X)) | NM(aggregation=NA.SUM)
    t = Template()
    t += R.reach(V.X)[e] <= R.start(V.X)
    t += (R.reach(V.Y)[w] <= (R.reach(V.X), R.edge(V.X, V.Y))) | Metadata(transformation=Transformation.TANH)
    t += R.reach / 1 | Metadata(transformation=Transformation.TANH)
    t += (R.q[[[1.0, -1.0, 0.5]]] <= R.reach(V.X)) | Metadata(aggregation=Aggregation.SUM)
    dataset, src, dst, example, starts = Dataset(), [], [], [], []
    for s, n in enumerate([2, 5, 1, 8]):
        nodes = [f"n{s}_{i}" for i in range(n)]
        dataset.add(NR.q[1.0], [NR.start(nodes[0])] + [NR.edge(a, b) for a, b in zip(nodes, nodes[1:])])
        src, dst, example, starts = src + nodes[:-1], dst + nodes[1:], example + [s] * (n - 1), starts + [nodes[0]]
    relations = {"start": Relation(starts, example=[0, 1, 2, 3]), "edge": Relation((src, dst), example=example)}
    graph = assert_equal(t, relations, R.q, model, dataset, copy_weights=False)
    assert sum(layer.name.startswith("reach@") for layer in graph.layers) == 8


FACTS = {"a": ([("x", 0.7), ("z", 0.1)], [("x", 0.3), ("y", 0.25)]),
         "b": ([("x", "y", 0.2), ("x", "x", 0.9), ("x", "z", -0.4)], [("x", "y", 0.5)]),
         "c": ([("x", 1 / 3), ("z", 2.0)], [("y", -1.5)])}


def _facts_both():
    dataset = Dataset()
    for e in range(2):
        dataset.add(NR.q[1.0], [NR.get(p)(*row[:-1])[row[-1]] for p, per in FACTS.items() for row in per[e]])
    relations = {}
    for p, per in FACTS.items():
        rows = [(e, row) for e in range(2) for row in per[e]]
        arity = len(rows[0][1]) - 1
        relations[p] = Relation(tuple([r[k] for _, r in rows] for k in range(arity)),
                                values=[r[-1] for _, r in rows], example=[e for e, _ in rows])
    return dataset, relations


def test_offsets_several_rules_max_negation_and_special(tmp_path):
    """Rule and predicate offsets, a head with two rules, max aggregation, ~a (1 - a) and @neq."""
    model = template_file("2.0 h(X) :- 1.5 a(X), -1.0 b(X, Y), @neq(X, Y), 0.25. [aggregation=max, "
                          "transformation=tanh]\nh(X) :- 3.0 c(X), ~a(X).\nh/1 0.125\nh/1 [transformation=sigmoid]\n"
                          "q :- h(X). [transformation=sigmoid]\n", tmp_path)
    t = Template()
    t += (R.h(V.X)[2.0] <= (R.a(V.X)[1.5], R.b(V.X, V.Y)[-1.0], R.special.neq(V.X, V.Y), 0.25)) | \
        Metadata(aggregation=Aggregation.MAX, transformation=Transformation.TANH)
    t += R.h(V.X) <= (R.c(V.X)[3.0], ~R.a(V.X))
    t += R.h / 1 | Metadata(offset=0.125, transformation=Transformation.SIGMOID)
    t += (R.q <= R.h(V.X)) | Metadata(transformation=Transformation.SIGMOID)
    dataset, relations = _facts_both()
    assert_equal(t, relations, R.q, model, dataset, copy_weights=False)


def test_avg_min_aggregations_and_combinations(tmp_path):
    """avg and min aggregations, avg/max/product combinations with offsets (scalars)."""
    model = template_file("h(X) :- 1.5 a(X), -0.5 c(X), 0.5. [combination=avg, aggregation=min]\n"
                          "h(X) :- 2.0 b(X, Y), a(Y). [combination=product]\n"
                          "g(X) :- h(X), -1.0 c(X), 0.25. [combination=max, aggregation=avg, transformation=relu]\n"
                          "2.0 q :- g(X).\nq :- -1.0 h(X). [aggregation=min]\nq/0 [transformation=tanh]\n", tmp_path)
    t = Template()
    t += (R.h(V.X) <= (R.a(V.X)[1.5], R.c(V.X)[-0.5], 0.5)) | Metadata(combination=Combination.AVG,
                                                                       aggregation=Aggregation.MIN)
    t += (R.h(V.X) <= (R.b(V.X, V.Y)[2.0], R.a(V.Y))) | Metadata(combination=Combination.PRODUCT)
    t += (R.g(V.X) <= (R.h(V.X), R.c(V.X)[-1.0], 0.25)) | Metadata(combination=Combination.MAX,
                                                                   aggregation=Aggregation.AVG,
                                                                   transformation=Transformation.RELU)
    t += R.q[2.0] <= R.g(V.X)
    t += (R.q <= R.h(V.X)[-1.0]) | Metadata(aggregation=Aggregation.MIN)
    t += R.q / 0 | Metadata(transformation=Transformation.TANH)
    dataset, relations = _facts_both()
    assert_equal(t, relations, R.q, model, dataset, copy_weights=False)


def test_embeddings_count_and_elementwise_product():
    """Template facts with learnable vector values (embeddings), a count aggregation, an elproduct rule."""
    model = Model()
    model += NR.emb(NC.x)[[1.0, 2.0]]
    model += NR.emb(NC.y)[[3.0, -4.0]]
    model += NR.h(NV.X) <= (NR.emb(NV.X)[[[1.0, 0.5], [0.0, 1.0]]], NR.n(NV.X))
    model += (NR.h(NV.X)[[0.5, -1.0]] <= (NR.n(NV.X), NR.m(NV.X, NV.Y))) | NM(aggregation=NA.COUNT)
    model += (NR.g(NV.X) <= (NR.n(NV.X)[0.5], NR.m(NV.X, NV.Y)[2.0])) | NM(aggregation=NA.MIN,
                                                                          combination=NCo.ELPRODUCT)
    model += NR.gv(NV.X)[[1.0, -1.0]] <= NR.g(NV.X)
    model += NR.q[[[1.0, 2.0]]] <= NR.h(NV.X)
    model += NR.q[[[1.0, 2.0]]] <= NR.gv(NV.X)
    dataset = Dataset()
    dataset.add(NR.q[1.0], [NR.n("x"), NR.n("y")[2.0], NR.n("z"), NR.m("x", "a")[3.0], NR.m("x", "b")[-1.0],
                            NR.m("z", "a")])
    t = Template()
    t += R.emb(C.x)[[1.0, 2.0]]
    t += R.emb(C.y)[[3.0, -4.0]]
    t += R.h(V.X) <= (R.emb(V.X)[[[1.0, 0.5], [0.0, 1.0]]], R.n(V.X))
    t += (R.h(V.X)[[0.5, -1.0]] <= (R.n(V.X), R.m(V.X, V.Y))) | Metadata(aggregation=Aggregation.COUNT)
    t += (R.g(V.X) <= (R.n(V.X)[0.5], R.m(V.X, V.Y)[2.0])) | Metadata(aggregation=Aggregation.MIN,
                                                                      combination=Combination.ELPRODUCT)
    t += R.gv(V.X)[[1.0, -1.0]] <= R.g(V.X)
    t += R.q[[[1.0, 2.0]]] <= R.h(V.X)
    t += R.q[[[1.0, 2.0]]] <= R.gv(V.X)
    relations = {"n": Relation(["x", "y", "z"], values=[1.0, 2.0, 1.0]),
                 "m": Relation((["x", "x", "z"], ["a", "b", "a"]), values=[3.0, -1.0, 1.0])}
    assert_equal(t, relations, R.q, model, dataset, copy_weights=False)


# -- templates shipped with PyNeuraLogic 0.9.2 --------------------------------------------------------------------
def test_shipped_xor():
    from neuralogic.utils.data import XOR
    model, dataset = XOR()
    t = Template()
    for k in range(1, 9):
        t += (R.get(f"hidden{k}") <= (R.a[1, ], R.b[1, ])) | Metadata(transformation=Transformation.TANH)
    for k in range(1, 9):
        t += (R.xor[1, ] <= R.get(f"hidden{k}")) | Metadata(transformation=Transformation.TANH)
    t += R.xor / 0 | Metadata(transformation=Transformation.TANH)
    for k in range(1, 9):
        t += R.get(f"hidden{k}") / 0 | Metadata(transformation=Transformation.TANH)
    relations, queries = read_examples(Path(dataset.examples_file))
    assert_equal(t, relations, queries, model, dataset)


def test_shipped_xor_vectorized():
    from neuralogic.utils.data import XOR_Vectorized
    model, dataset = XOR_Vectorized()
    t = Template()
    t += (R.xor[1, 8] <= R.xy[8, 2]) | Metadata(transformation=Transformation.TANH)
    t += R.xor / 0 | Metadata(transformation=Transformation.TANH)
    relations, queries = read_examples(Path(dataset.examples_file))
    assert_equal(t, relations, queries, model, dataset)


def test_shipped_trains():
    """Predicates of one name and two arities (shape/2 and shape/3), constants in bodies, five levels."""
    from neuralogic.utils.data import Trains
    model, dataset = Trains()
    tanh = Metadata(transformation=Transformation.TANH)
    t = Template()
    properties = {"shape": ["ellipse", "rectangle", "bucket", "hexagon", "u_shaped"], "length": ["short", "long"],
                  "sides": ["not_double", "double"], "roof": ["jagged", "arc", "none", "flat", "peaked"],
                  "wheels": [2, 3], "loadnum": [0, 1, 2, 3],
                  "loadshape": ["hexagon", "triangle", "diamond", "rectangle", "circle"]}
    for name, values in properties.items():
        for value in values:
            t += (R.get(name)(V.X, V.Y) <= R.get(name)(V.X, V.Y, value)[1, ]) | tanh
        t += R.get(name) / 2 | tanh
    order = ["shape", "length", "sides", "wheels", "loadnum", "loadshape", "roof"]
    t += (R.vagon(V.X, V.Y) <= [R.get(name)(V.X, V.Y)[1, ] for name in order]) | tanh
    t += R.vagon / 2 | tanh
    for k in (1, 2, 3, 4):
        t += (R.train(V.X) <= R.vagon(V.X, k)[1, ]) | tanh
    t += R.train / 1 | tanh
    t += (R.direction(V.X) <= R.train(V.X)[1, ]) | tanh
    t += R.direction / 1 | tanh
    relations, queries = read_examples(Path(dataset.examples_file), Path(dataset.queries_file))
    assert_equal(t, relations, queries, model, dataset)


def _mutagenesis_builtin():
    """NeuraLogic's own Mutagenesis template (templates/template.txt with embeddings.txt), ported line by line."""
    tanh = Metadata(transformation=Transformation.TANH)
    t = Template()
    for element in ("c", "o", "br", "i", "f", "h", "n", "cl"):
        t += (R.atom_embed(V.A)[3, 1] <= R.get(element)(V.A)) | tanh
    t += R.atom_embed / 1 | Metadata(offset=(3, 1))
    for bond in ("b_1", "b_2", "b_3", "b_4", "b_5", "b_7"):
        t += (R.bond_embed(V.B)[3, 1] <= R.get(bond)(V.B)) | tanh
    t += R.bond_embed / 1 | Metadata(offset=(3, 1))
    t += R.bond_embed / 1 | tanh
    t += R.atom_embed / 1 | tanh
    previous = "atom_embed"
    for k in (1, 2, 3):
        t += (R.get(f"l{k}_embed")(V.X) <= (R.get(previous)(V.X)[3, 3], R.get(previous)(V.Y)[3, 3],
                                            R.bond(V.X, V.Y, V.B), R.bond_embed(V.B))) | tanh
        previous = f"l{k}_embed"
    for k in (1, 2, 3):
        t += R.get(f"l{k}_embed") / 1 | tanh
    t += (R.predict[1, 3] <= R.l3_embed(V.X)) | tanh
    t += R.predict / 0 | tanh
    return t


MUTAGENESIS_PREDICATES = [f"{p}/1" for p in ("c", "o", "br", "i", "f", "h", "n", "cl", "b_1", "b_2", "b_3", "b_4",
                                              "b_5", "b_7")]


def mutagenesis_data(tmp_path, first: int | None):
    """NeuraLogic's Mutagenesis molecules (the first ``first``, written to files of their own so NeuraLogic builds
    only those), as a FileDataset and as relations."""
    folder = DATA / "molecules" / "mutagenesis"
    examples, queries = folder / "examples.txt", folder / "queries.txt"
    if first is not None:
        for path in (examples, queries):
            lines = [line for line in path.read_text().splitlines() if line.strip()][:first]
            (tmp_path / path.name).write_text("\n".join(lines) + "\n")
        examples, queries = tmp_path / examples.name, tmp_path / queries.name
    relations, asked = read_examples(examples, queries, predicates=MUTAGENESIS_PREDICATES)
    return FileDataset(examples_file=str(examples), queries_file=str(queries)), relations, asked


@pytest.mark.parametrize("first", [6, pytest.param(None, marks=pytest.mark.slow)], ids=["6-molecules", "all"])
def test_shipped_mutagenesis(tmp_path, first):
    """NeuraLogic's own Mutagenesis template: the thesis 6.3 "simple" architecture."""
    model = Model(model_file=str(DATA / "molecules" / "mutagenesis" / "templates" / "template.txt"))
    dataset, relations, queries = mutagenesis_data(tmp_path, first)
    assert_equal(_mutagenesis_builtin(), relations, queries, model, dataset)


DIMS = "".join([f"{{3,1}} atom_embed(A) :- {e}(A). [activation=tanh]\n" for e in ("c", "o", "br", "i", "f", "h", "n",
                                                                                  "cl")] +
               [f"{{2,1}} bond_embed(B) :- {b}(B). [activation=tanh]\n" for b in ("b_1", "b_2", "b_3", "b_4", "b_5",
                                                                                 "b_7")] +
               ["atom_embed / 1 [activation=tanh]\nbond_embed / 1 [activation=tanh]\n"] +
               [f"l{k}_embed(X) :- {{3,3}} {p}(X), {{3,3}} {p}(Y), bond(X,Y,B), {{3,2}} bond_embed(B). "
                f"[activation=tanh]\nl{k}_embed / 1 [activation=tanh]\n"
                for k, p in ((1, "atom_embed"), (2, "l1_embed"), (3, "l2_embed"))] +
               ["{1,3} predict :- l3_embed(X). [activation=tanh]\npredict / 0 [activation=tanh]\n"])


@pytest.mark.parametrize("first", [6, pytest.param(None, marks=pytest.mark.slow)], ids=["6-molecules", "all"])
def test_mutagenesis_dims(tmp_path, first):
    """Thesis 6.3 "dims": bond embeddings of another size, mapped by a matrix in every layer."""
    tanh = Metadata(transformation=Transformation.TANH)
    t = Template()
    for element in ("c", "o", "br", "i", "f", "h", "n", "cl"):
        t += (R.atom_embed(V.A)[3, 1] <= R.get(element)(V.A)) | tanh
    for bond in ("b_1", "b_2", "b_3", "b_4", "b_5", "b_7"):
        t += (R.bond_embed(V.B)[2, 1] <= R.get(bond)(V.B)) | tanh
    t += R.atom_embed / 1 | tanh
    t += R.bond_embed / 1 | tanh
    for k, previous in ((1, "atom_embed"), (2, "l1_embed"), (3, "l2_embed")):
        t += (R.get(f"l{k}_embed")(V.X) <= (R.get(previous)(V.X)[3, 3], R.get(previous)(V.Y)[3, 3],
                                            R.bond(V.X, V.Y, V.B), R.bond_embed(V.B)[3, 2])) | tanh
        t += R.get(f"l{k}_embed") / 1 | tanh
    t += (R.predict[1, 3] <= R.l3_embed(V.X)) | tanh
    t += R.predict / 0 | tanh
    dataset, relations, queries = mutagenesis_data(tmp_path, first)
    assert_equal(t, relations, queries, template_file(DIMS, tmp_path), dataset)


@pytest.mark.slow
def test_shipped_nations():
    """Nations: one example, 5,351 queries of two predicates predict/2 and predict/3, 182 embedding rules."""
    from neuralogic.utils.data import Nations
    model, dataset = Nations()
    t = Template()
    for line in (DATA / "nations" / "embeddings.txt").read_text().splitlines():  # {3} embed_x(c) :- x(c).
        name, constant, body = re.fullmatch(r"\{3\} (\w+)\((\w+)\) :- (\w+)\(\w+\)\.", line.strip()).groups()
        t += R.get(name)(C.get(constant))[3, ] <= R.get(body)(C.get(constant))
    t += R.predict(V.Nation, V.Attribute)[1, 3] <= (R.embed_nation(V.Nation)[3, 3], R.embed_att(V.Attribute)[3, 3])
    t += R.embed_nat1(V.X) <= (R.embed_rel(V.R)[3, 3], R.embed_nation(V.Y)[3, 3], R.r(V.X, V.R, V.Y)[3, ])
    t += R.embed_nat2(V.Y) <= (R.embed_nation(V.X)[3, 3], R.embed_rel(V.R)[3, 3], R.r(V.X, V.R, V.Y)[3, ])
    t += R.predict(V.X, V.R, V.Y)[1, 3] <= (R.embed_nat1(V.X)[3, 3], R.embed_nat2(V.Y)[3, 3], R.embed_rel(V.R)[3, 3])
    relations, queries = read_examples(Path(dataset.examples_file), Path(dataset.queries_file))
    assert_equal(t, relations, queries, model, dataset)


def _gnn_pair(mutag, module, graphs, rng):
    """A two-layer GNN of a neuralogic.nn module (SAGEConv or GINConv) and an average readout, for NeuraLogic and
    for neurovec; explicit random weights in both."""
    width, hidden = mutag.node_features().shape[1], 4
    model = Model()
    for k in (1, 2):
        activation = NT.RELU if k == 1 else NT.IDENTITY
        source = "node_feature" if k == 1 else "h1"
        for rule in module(width if k == 1 else hidden, hidden, f"h{k}", source, "edge", activation=activation)():
            model += rule
    model += (NR.predict[1, hidden] <= NR.h2(NV.X)) | NM(aggregation=NA.AVG)
    model += NR.predict / 0 | NM(transformation=NT.SIGMOID)
    values, given = [], {}
    for rule in model:   # the modules give dimensions only: set values, in template order
        relations = [rule.head, *rule.body] if hasattr(rule, "body") else []
        for relation in relations:
            if id(relation) in given:  # one relation object in two rules: two weights of one initial value
                values.append(given[id(relation)])
            elif isinstance(getattr(relation, "weight", None), tuple):
                given[id(relation)] = value = rng.normal(size=relation.weight).round(4)
                relation.weight = value.tolist()
                values.append(value)
    return model, tu_tensor_dataset(mutag, graphs), values


def _neurovec_sage(values):
    values = iter(values)
    t, source = Template(), "node_feature"
    for k in (1, 2):
        act = Transformation.RELU if k == 1 else Transformation.IDENTITY
        t += (R.get(f"h{k}")(V.I)[next(values)] <= (R.get(source)(V.J), R.hidden.edge(V.J, V.I))) | \
            Metadata(aggregation=Aggregation.AVG)
        t += (R.get(f"h{k}")(V.I)[next(values)] <= R.get(source)(V.I)) | Metadata(aggregation=Aggregation.AVG)
        t += R.get(f"h{k}") / 1 | Metadata(transformation=act)
        source = f"h{k}"
    t += (R.predict[next(values)] <= R.h2(V.X)) | Metadata(aggregation=Aggregation.AVG)
    t += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    return t


def _neurovec_gin(values):
    values = iter(values)
    t, source = Template(), "node_feature"
    for k in (1, 2):
        act = Transformation.RELU if k == 1 else Transformation.IDENTITY
        t += (R.get(f"h{k}")(V.I)[next(values)] <= (R.get(source)(V.J), R.hidden.edge(V.J, V.I))) | \
            Metadata(aggregation=Aggregation.SUM)
        t += (R.get(f"embed__h{k}")(V.I) <= R.get(source)(V.I)) | Metadata(aggregation=Aggregation.SUM)
        head, body = next(values), next(values)
        t += (R.get(f"h{k}")(V.I)[head] <= R.get(f"embed__h{k}")(V.I)[body]) | Metadata(transformation=act)
        t += R.get(f"h{k}") / 1 | Metadata(transformation=act)
        source = f"h{k}"
    t += (R.predict[next(values)] <= R.h2(V.X)) | Metadata(aggregation=Aggregation.AVG)
    t += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    return t


def _tu_relations(ds, graphs, norm=False):
    from neurovec.sources.relational import models
    return models.tu_facts(ds, norm=norm), Query("predict", example=np.asarray(graphs))


@pytest.mark.parametrize("module, n_graphs", [
    ("sage", 12), pytest.param("gin", 12, marks=pytest.mark.slow), pytest.param("sage", 188, marks=pytest.mark.slow),
    pytest.param("gin", 188, marks=pytest.mark.slow)])
def test_shipped_gnn_modules_on_mutag(mutag, module, n_graphs):
    """SAGE- and GIN-like: PyNeuraLogic's own SAGEConv and GINConv modules, two layers and an average readout."""
    rng = np.random.default_rng(7)
    graphs = np.arange(n_graphs)
    model, dataset, values = _gnn_pair(mutag, {"sage": SAGEConv, "gin": GINConv}[module], graphs, rng)
    relations, queries = _tu_relations(mutag, graphs)
    relations["node_feature"] = relations.pop("feature")
    template = {"sage": _neurovec_sage, "gin": _neurovec_gin}[module](values)
    assert_equal(template, relations, queries, model, dataset, copy_weights=False)


@pytest.mark.parametrize("n_graphs", [16, pytest.param(188, marks=pytest.mark.slow)])
def test_gcn_like_on_mutag(mutag, n_graphs):
    """GCN as NeuraLogic writes it with precomputed normalization: {H,F} h1(I) :- h0(J), edge(J, I).
    [combination=product, aggregation=sum] (the benchmark's NeuraLogic GCN)."""
    rng = np.random.default_rng(3)
    graphs = np.arange(n_graphs)
    widths = [mutag.node_features().shape[1], 6, 6]
    weights = [rng.normal(size=(widths[k + 1], widths[k])).round(4) for k in range(2)] + \
        [rng.normal(size=(1, 6)).round(4)]
    model, t = Model(), Template()
    for k in (1, 2):
        act = (NT.RELU, Transformation.RELU) if k == 1 else (NT.IDENTITY, Transformation.IDENTITY)
        model += (NR.get(f"h{k}")(NV.I)[weights[k - 1].tolist()] <= (NR.get(f"h{k - 1}")(NV.J), NR.edge(NV.J, NV.I))) \
            | NM(combination=NCo.PRODUCT, aggregation=NA.SUM)
        model += NR.get(f"h{k}") / 1 | NM(transformation=act[0])
        t += (R.get(f"h{k}")(V.I)[weights[k - 1]] <= (R.get(f"h{k - 1}")(V.J), R.edge(V.J, V.I))) | \
            Metadata(combination=Combination.PRODUCT, aggregation=Aggregation.SUM)
        t += R.get(f"h{k}") / 1 | Metadata(transformation=act[1])
    model += (NR.predict[weights[2].tolist()] <= NR.h2(NV.X)) | NM(aggregation=NA.AVG)
    model += NR.predict / 0 | NM(transformation=NT.SIGMOID)
    t += (R.predict[weights[2]] <= R.h2(V.X)) | Metadata(aggregation=Aggregation.AVG)
    t += R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)
    relations, queries = _tu_relations(mutag, graphs, norm=True)
    relations = {"h0": relations["feature"], "edge": relations["norm"]}
    dataset = tu_tensor_dataset(mutag, graphs, norm=True, feature="h0")
    assert_equal(t, relations, queries, model, dataset, copy_weights=False)
