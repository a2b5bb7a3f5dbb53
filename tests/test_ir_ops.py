"""Every IR op, layout and reduce kernel, generated and run, against numpy."""
import numpy as np
import pytest
import torch

from neurovec.compiler.ir import IRError, Node, Op, Program
from neurovec.engines.torch_module import CompiledModule
from neurovec.sources.graph import Weight

RNG = np.random.default_rng(0)


def run(nodes, constants, weights=(), output=None):
    program = Program(tuple(nodes), constants, tuple(weights), output or nodes[-1].name)
    return CompiledModule(program, torch.float64)().detach().numpy()


def fact(name, values):
    return Node(name, Op.FACT, (), values.shape[0], values.shape[1:], {"const": f"c_{name}"})


def test_slice_tile_interleave():
    x = RNG.normal(size=(6, 2))
    c = {"c_x": x}
    f = fact("x", x)
    np.testing.assert_array_equal(run([f, Node("s", Op.SLICE, ("x",), 2, (2,), {"start": 1, "stop": 6, "step": 3})],
                                      c), x[1:6:3])
    np.testing.assert_array_equal(run([f, Node("t", Op.TILE, ("x",), 12, (2,), {"times": 2})], c), np.tile(x, (2, 1)))
    np.testing.assert_array_equal(run([f, Node("i", Op.INTERLEAVE, ("x",), 18, (2,), {"times": 3})], c),
                                  np.repeat(x, 3, axis=0))


@pytest.mark.parametrize("w_layout,x_layout,cw,cx,n", [
    ("full", "full", 6, 6, 6), ("tile", "full", 1, 6, 6), ("tile", "full", 2, 6, 6),
    ("interleave", "full", 3, 6, 6), ("full", "tile", 6, 2, 6), ("full", "interleave", 6, 1, 6),
    ("tile", "interleave", 2, 3, 6), ("interleave", "tile", 3, 2, 6)])
@pytest.mark.parametrize("kind,w_shape,x_shape", [
    ("matmul", (4, 3), (3,)), ("matmul", (4, 3), (3, 2)), ("mul", (), (3,)), ("mul", (3,), ()), ("mul", (3,), (3,))])
def test_linear_layouts(w_layout, x_layout, cw, cx, n, kind, w_shape, x_shape):
    w, x = RNG.normal(size=(cw,) + w_shape), RNG.normal(size=(cx,) + x_shape)
    nodes = [fact("w", w), fact("x", x)]
    out_shape = (w[0] @ x[0]).shape if kind == "matmul" else np.broadcast(w[0], x[0]).shape
    nodes.append(Node("y", Op.LINEAR, ("w", "x"), n, out_shape,
                      {"kind": kind, "w_layout": w_layout, "x_layout": x_layout}))
    g1 = cw if w_layout == "interleave" else cx if x_layout == "interleave" else None
    g2 = cw if w_layout == "tile" else cx if x_layout == "tile" else None
    g1 = g1 or (n // g2 if g2 else n)
    g2 = g2 or n // g1

    def row(layout, count, e):
        return {"full": e, "tile": e % g2, "interleave": e // g2}[layout]

    expected = []
    for e in range(n):
        we, xe = w[row(w_layout, cw, e)], x[row(x_layout, cx, e)]
        expected.append(we @ xe if kind == "matmul" else we * xe)
    np.testing.assert_allclose(run(nodes, {"c_w": w, "c_x": x}), np.stack(expected), rtol=1e-12)


@pytest.mark.parametrize("kernel", ["scatter", "segment", "dense", "strided"])
@pytest.mark.parametrize("aggregation", ["sum", "mean", "max", "min", "prod"])
def test_reduce_kernels(kernel, aggregation):
    counts = np.array([3, 3, 3, 3]) if kernel in ("dense", "strided") else np.array([1, 4, 2, 3])
    x = RNG.normal(size=(counts.sum(), 2))
    nodes = [fact("x", x), Node("r", Op.REDUCE, ("x",), len(counts), (2,),
                                {"aggregation": aggregation, "counts": "cnt", "kernel": kernel})]
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[aggregation]
    if kernel == "strided":
        expected = fn(x.reshape(3, 4, 2), axis=0)
    else:
        expected = np.stack([fn(part, axis=0) for part in np.split(x, np.cumsum(counts)[:-1])])
    np.testing.assert_allclose(run(nodes, {"c_x": x, "cnt": counts}), expected, rtol=1e-12)


def test_weights_stack_and_verify_errors():
    w = [Weight("a", [1.0, 2.0]), Weight("b", [3.0, 4.0], learnable=False)]
    nodes = [Node("w", Op.WEIGHTS, (), 2, (2,), {"names": ("a", "b")})]
    np.testing.assert_array_equal(run(nodes, {}, w), [[1, 2], [3, 4]])
    bad = [fact("x", np.ones((2, 2))), Node("g", Op.GATHER, ("x",), 1, (2,), {"index": "i"})]
    with pytest.raises(IRError, match="GATHER index out of range"):
        Program(tuple(bad), {"c_x": np.ones((2, 2)), "i": np.array([2])}, (), "g").verify()
    bad = [fact("x", np.ones((5, 2))), fact("w", np.ones((2, 2))),
           Node("y", Op.LINEAR, ("w", "x"), 5, (2,), {"kind": "mul", "w_layout": "tile"})]
    with pytest.raises(IRError, match="does not fit 5 rows"):
        Program(tuple(bad), {"c_x": np.ones((5, 2)), "c_w": np.ones((2, 2))}, (), "y").verify()


def test_verify_checks_that_unit_facts_hold_scalar_ones():
    """Units are stored as scalar ones from the start (thesis 5.2.8 A builds nothing here)."""
    unit = Node("f_u", Op.FACT, (), 2, (), {"const": "c_u", "fact_layer": "u", "unit": True})
    Program((unit,), {"c_u": np.ones(2)}, (), "f_u").verify()
    with pytest.raises(IRError, match="scalar ones"):
        Program((unit,), {"c_u": np.array([1.0, 2.0])}, (), "f_u").verify()


def test_verify_since_an_earlier_program_checks_what_changed():
    x = fact("x", np.ones((3, 2)))
    g = Node("g", Op.GATHER, ("x",), 2, (2,), {"index": "i"})
    good = Program((x, g), {"c_x": np.ones((3, 2)), "i": np.array([0, 2])}, (), "g")
    good.verify()
    # The same node object over a new index array under the same name: checked again.
    with pytest.raises(IRError, match="GATHER index out of range"):
        good.replace(constants={**good.constants, "i": np.array([0, 3])}).verify(unchanged_since=good)
    # The same node object reading a new, shorter source: checked again.
    shorter = x.with_(count=2)
    with pytest.raises(IRError, match="GATHER index out of range"):
        good.replace(nodes=(shorter, g), constants={**good.constants, "c_x": np.ones((2, 2))}
                     ).verify(unchanged_since=good)
    # A new node object: checked.
    with pytest.raises(IRError, match="GATHER index out of range"):
        good.replace(nodes=(x, g.with_(srcs=("x",)))).replace(
            constants={**good.constants, "i": np.array([5, 0])}).verify(unchanged_since=good)
    # Unchanged nodes are not scanned again: an earlier program that (wrongly) passed as verified
    # vouches for them, which is what saves the scans after passes that change few nodes.
    bad = good.replace(constants={**good.constants, "i": np.array([0, 3])})
    bad.verify(unchanged_since=bad)
    with pytest.raises(IRError, match="GATHER index out of range"):
        bad.verify()


def test_indices_are_int32_in_the_program_and_the_module(tu_dir):
    import neurovec
    from neurovec import datasets
    from neurovec.compiler.ir import compact_index
    from neurovec.engines.torch_module import _backward_indices
    graph = datasets.gcn(datasets.load_tu("MUTAG", tu_dir, download=False))
    for preset in ("unoptimized", "default", "upward-17-aggressive"):
        module = neurovec.compile(graph, preset)
        integer = {k: a for k, a in module.program.constants.items() if np.issubdtype(a.dtype, np.integer)}
        assert integer and all(a.dtype == np.int32 for a in integer.values()), preset
        # The module keeps them, except the indices of gathers with a backward (int64: index_add_
        # is ~20x slower with int32).
        backward = _backward_indices(module.program)
        assert all(getattr(module, k).dtype == torch.int64 for k in backward), preset
        assert all(getattr(module, k).dtype == torch.int32 for k in set(integer) - backward), preset
    assert compact_index(np.array([0, 2**31])).dtype == np.int64  # does not fit: stays int64
    assert compact_index(np.zeros(0, np.int64)).dtype == np.int32


def test_node_equality_includes_attrs():
    # Two GATHERs of the same rows count but different indices are different nodes (issue 24).
    g = Node("g", Op.GATHER, ("x",), 2, (3,), {"index": "idx_a"})
    assert g != g.with_(attrs={"index": "idx_b"})
    assert g == g.with_(attrs={"index": "idx_a"}) and hash(g) == hash(g.with_(attrs={"index": "idx_b"}))


def test_node_attrs_are_read_only():
    # A pass that changed a node's attrs in place would change every program sharing the node.
    import copy
    import pickle
    g = Node("g", Op.GATHER, ("x",), 2, (3,), {"index": "idx_a"})
    for change in (lambda a: a.__setitem__("index", "idx_b"), lambda a: a.update(index="idx_b"),
                   lambda a: a.pop("index"), lambda a: a.clear(), lambda a: a.setdefault("k", 1)):
        with pytest.raises(TypeError, match="cannot be changed"):
            change(g.attrs)
    assert g.attrs == {"index": "idx_a"}
    assert g.with_(attrs={**g.attrs, "index": "idx_b"}).attrs["index"] == "idx_b"  # a new node instead
    for twin in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert twin == g and type(twin.attrs) is type(g.attrs)


def test_stored_arrays_are_read_only(tu_dir):
    # A pass that wrote a constant in place would change every program (and module) sharing it.
    import copy
    import pickle
    import warnings

    import neurovec
    from neurovec import datasets
    from neurovec.compiler.rewrite import Rewriter
    x = np.arange(6.0).reshape(3, 2)
    program = Program((fact("x", x),), {"c_x": x}, (), "x")
    assert x.flags.writeable  # the caller's array is left as it is; the program's is a read-only view
    graph = datasets.gcn(datasets.load_tu("MUTAG", tu_dir, download=False))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The given NumPy array is not writable")  # torch's warning
        module = neurovec.compile(graph, "default")
    for constants in (program.constants, module.program.constants, pickle.loads(pickle.dumps(program)).constants,
                      copy.deepcopy(module.program).constants):
        for array in constants.values():
            with pytest.raises(ValueError, match="read-only"):
                array[...] = 0
    rw = Rewriter(program)
    with pytest.raises(ValueError, match="read-only"):
        rw.constants[rw.const("idx", np.array([2, 0]))][0] = 1
    np.testing.assert_array_equal(program.constants["c_x"], np.arange(6.0).reshape(3, 2))


def test_constant_references_are_typed():
    # A node's constants are its CONST_ATTRS, never a string that happens to name a constant.
    from neurovec.compiler.ir import CONST_ATTRS
    from neurovec.compiler.rewrite import eliminate_dead_code
    x = np.arange(6.0).reshape(3, 2)
    nodes = (fact("x", x), Node("g", Op.GATHER, ("x",), 2, (2,), {"index": "i"}),
             Node("t", Op.TRANSFORM, ("g",), 2, (2,), {"fn": "sigmoid"}))
    program = Program(nodes, {"c_x": x, "i": np.array([2, 0]), "sigmoid": np.zeros(1)}, (), "t")
    assert [n.consts for n in nodes] == [("c_x",), ("i",), ()] and Op.TRANSFORM not in CONST_ATTRS
    assert set(eliminate_dead_code(program).constants) == {"c_x", "i"}  # "sigmoid" is read by no node
    assert "fn='sigmoid'" in str(program) and "index=i=[2, 0]" in str(program)
    with pytest.raises(IRError, match="%g GATHER reads constant 'j', which the program lacks"):
        program.replace(nodes=(nodes[0], nodes[1].with_(attrs={"index": "j"}), nodes[2])).verify()
