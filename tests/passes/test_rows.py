"""Tracing rows through indexing ops and fixed scalar products (compiler/indexing.py)."""
import numpy as np

from neurovec.compiler.ir import Op
from neurovec.compiler.indexing import constant_values, trace_rows

from ..builders import Builder


def test_rows_through_gather_concat_tile_interleave():
    b = Builder()
    b.fact("a", np.arange(6.0).reshape(3, 2))
    b.fact("c", np.arange(4.0).reshape(2, 2))
    b.transform("h", "a", "tanh")
    b.gather("g", "h", [2, 0])
    b.concat("cat", "g", "c")                                  # rows: h2 h0 c0 c1
    b.gather("pick", "cat", [3, 0, 1, 2])                      # c1 h2 h0 c0
    b._add("tile", Op.TILE, ("pick",), 8, (2,), times=2)
    b._add("twice", Op.INTERLEAVE, ("tile",), 16, (2,), times=2)
    program = b.build("twice")
    origins = trace_rows(program, program.by_name(), "twice")
    assert sorted(origins.bases) == ["c", "h"]
    assert [origins.bases[k] for k in origins.which] == ["c", "c", "h", "h", "h", "h", "c", "c"] * 2
    assert origins.row.tolist() == [1, 1, 2, 2, 0, 0, 0, 0] * 2
    assert origins.coef.tolist() == [1.0] * 16 and not origins.scaled


def test_rows_through_fixed_scalar_products_with_broadcasting():
    b = Builder()
    b.fact("x", np.ones((3, 2)))
    b.transform("h", "x", "tanh")
    b.weights("s", (), k=2, learnable=False, values=[0.5, -2.0])
    b.weights("t", (), k=1, learnable=True)
    # A (2 x 3) grid: scalar row i (interleaved) times value row j (tiled).
    b.linear("p", "s", "h", count=6, w_layout="interleave", x_layout="tile")
    b.linear("q", "t", "h", count=3, w_layout="tile", x_layout="full")   # a learnable factor: a base
    program = b.build("p")
    nodes = program.by_name()
    origins = trace_rows(program, nodes, "p", scalars=True)
    assert origins.bases == ["h"] and origins.scaled
    assert origins.row.tolist() == [0, 1, 2, 0, 1, 2]
    assert origins.coef.tolist() == [0.5, 0.5, 0.5, -2.0, -2.0, -2.0]
    learnable = trace_rows(program, nodes, "q", scalars=True)
    assert learnable.bases == ["q"] and not learnable.scaled


def test_constant_values_of_facts_and_fixed_weights_only():
    b = Builder()
    b.fact("x", [[1.0], [2.0]])
    b.weights("s", (), k=2, learnable=False, values=[3.0, 4.0])
    b.weights("t", (), k=1)
    b.concat("cat", "s", "t")
    b.gather("g", "s", [1, 1, 0])
    program = b.build("g")
    nodes = program.by_name()
    values, facts = constant_values(program, nodes, "g", np.arange(3))
    assert values.tolist() == [4.0, 4.0, 3.0] and facts == set()
    assert constant_values(program, nodes, "cat", np.array([0, 2])) is None  # reads a learnable weight
    values, facts = constant_values(program, nodes, "x", np.array([1]))
    assert values.tolist() == [[2.0]] and facts == {"x"}
    dynamic = program.replace(dynamic_facts=("x",))
    assert constant_values(dynamic, nodes, "x", np.array([1])) is None


def test_tracing_leaves_no_garbage_cycle():
    # The recursive walk must not keep itself and the edge-sized pieces it saw alive until the
    # garbage collector runs.
    import gc
    b = Builder()
    b.fact("a", np.arange(6.0).reshape(3, 2))
    b.transform("h", "a", "tanh")
    b.gather("g", "h", [2, 0, 1, 1])
    program = b.build("g")
    gc.collect()
    gc.disable()
    try:
        trace_rows(program, program.by_name(), "g")
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_tiled_scalar_side_read_by_many_rows():
    """A fixed-scalar side read more often than it has rows is traced once per row, then indexed
    (rows._scalar_values): the same factors; and where that side also holds a learnable weight
    that these rows never read, they are still scaled (only their own rows are traced then)."""
    b = Builder()
    b.fact("x", np.ones((2, 2)))
    b.transform("h", "x", "tanh")
    b.weights("s", (), k=2, learnable=False, values=[0.5, -2.0])
    b.weights("t", (), k=1, learnable=True)
    b.gather("one", "s", [1, 0, 1])
    b.concat("mixed", "s", "t")
    for side in ("one", "mixed"):
        # A (2 x 3) grid: value row e // 3 (interleaved) times side row e % 3 (tiled).
        b.linear(f"p_{side}", side, "h", count=6, w_layout="tile", x_layout="interleave")
        b.gather(f"pick_{side}", f"p_{side}", [0, 1, 3, 4, 4, 3, 1, 0])  # side rows 0 1 0 1 1 0 1 0
    program = b.build("pick_one")
    nodes = program.by_name()
    one = trace_rows(program, nodes, "pick_one", scalars=True)
    assert one.bases == ["h"] and one.scaled
    assert one.row.tolist() == [0, 0, 1, 1, 1, 1, 0, 0]
    assert one.coef.tolist() == [-2.0, 0.5, -2.0, 0.5, 0.5, -2.0, 0.5, -2.0]
    mixed = trace_rows(program, nodes, "pick_mixed", scalars=True)
    assert mixed.bases == ["h"] and mixed.scaled
    assert mixed.coef.tolist() == [0.5, -2.0, 0.5, -2.0, -2.0, 0.5, -2.0, 0.5]
