"""End-to-end behaviour of compiled modules (thesis Fig. 4.1, JSON, facts, state)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import neurovec
from neurovec.sources.graph import GraphError

from .equivalence import assert_equivalent

_spec = importlib.util.spec_from_file_location("fig41", Path(__file__).parents[1] / "examples" / "fig41.py")
fig41 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fig41)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_fig41_equals_reference_and_hand_computation():
    graph = fig41.fig41_graph()
    module = neurovec.compile(graph, dtype=torch.float64)
    assert_equivalent(graph, module)
    # Molecule 2 (h3 - h4) by hand: each atom has one bond, so both h(X) are equal.
    W = {w.name: w.value for w in graph.weights}
    rule = sigmoid(W["W_a"] + W["W_b"])
    h = sigmoid(W["W_h1"] @ rule)
    q = sigmoid(W["W_q"] @ sigmoid(W["W_h2"] @ h))
    np.testing.assert_allclose(module()[1].detach().numpy(), q, rtol=1e-12)


def test_json_round_trip_is_exact(tmp_path):
    graph = fig41.fig41_graph()
    neurovec.save_json(graph, tmp_path / "g.json")
    again = neurovec.load_json(tmp_path / "g.json")
    assert neurovec.sources.graph_to_dict(again) == neurovec.sources.graph_to_dict(graph)
    for w, w2 in zip(graph.weights, again.weights):
        assert w.name == w2.name and np.array_equal(w.value, w2.value) and w.learnable == w2.learnable
    torch.testing.assert_close(neurovec.compile(again, dtype=torch.float64)(),
                               neurovec.compile(graph, dtype=torch.float64)(), rtol=0, atol=0)


def test_program_is_printed_and_outputs_follow_declared_order():
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.arange(4.0)[:, None] * np.ones((4, 2)))
    layer = b.layer("double", transformation="identity")
    refs = [layer.neuron([(x[i], None), (x[i], None)]) for i in range(4)]  # repeated input: 2 x
    b.output(refs[3], refs[0], refs[3])
    module = neurovec.compile(b.build(), neurovec.Settings(fold_constants=False))  # (all constant otherwise)
    assert "index_select" in module.code and "def forward" in module.code
    torch.testing.assert_close(module(), torch.tensor([[6.0, 6.0], [0.0, 0.0], [6.0, 6.0]]))


def test_state_dict_round_trip_and_parameter_names():
    graph = fig41.fig41_graph()
    module = neurovec.compile(graph)
    assert sorted(module.state_dict()) == sorted(f"weights.{w.name}" for w in graph.weights)
    other = neurovec.compile(fig41.fig41_graph(seed=1))
    assert not torch.equal(other(), module())
    other.load_state_dict(module.state_dict())
    torch.testing.assert_close(other(), module())
    assert {n for n, _ in module.named_parameters()} == {f"weights.{w.name}" for w in graph.weights}


def test_dotted_weight_names_nest_like_torch_modules():
    b = neurovec.GraphBuilder()
    b.weight("conv1.lin.weight", np.ones((2, 2)))
    b.weight("conv1.bias", np.zeros(2), learnable=False)
    x = b.facts("x", np.ones((1, 2)))
    n = b.layer("l").neuron([(x[0], "conv1.lin.weight")], bias="conv1.bias")
    b.output(n)
    module = neurovec.compile(b.build())
    # The fixed bias is a non-persistent buffer: the state dict holds the learnable weights only.
    assert set(module.state_dict()) == {"weights.conv1.lin.weight"}
    assert [n for n, _ in module.named_parameters()] == ["weights.conv1.lin.weight"]
    assert [n for n, _ in module.weights.named_buffers()] == ["conv1.bias"]


def test_facts_replaced_at_call_time_without_recompiling():
    b = neurovec.GraphBuilder()
    w = b.weight("w", [[2.0, 0.0], [0.0, 3.0]])
    x = b.facts("x", np.ones((2, 2)))
    layer = b.layer("l", aggregation="sum")
    b.output(layer.neuron([(x[0], w), (x[1], w)]))
    graph = b.build()
    new_x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    for preset in neurovec.list_presets():
        module = neurovec.compile(graph, neurovec.Settings.preset(preset, dynamic_facts=("x",)))
        torch.testing.assert_close(module(), torch.tensor([[4.0, 6.0]]))
        torch.testing.assert_close(module(facts={"x": new_x}), torch.tensor([[2.0, 3.0]]), msg=preset)
    # Undeclared, the default preset deduplicates x by value: replacing it would be wrong, so it is refused.
    with pytest.raises(GraphError, match="'x' cannot be replaced at call time.*Settings.dynamic_facts"):
        neurovec.compile(graph)(facts={"x": new_x})
    with pytest.raises(GraphError, match="replacement has shape"):
        module(facts={"x": torch.ones(3, 2)})
    with pytest.raises(GraphError, match="'nope' cannot be replaced"):
        module(facts={"nope": torch.ones(3, 2)})


def test_double_keeps_constants_exact():
    b = neurovec.GraphBuilder()
    x = b.facts("x", np.array([[0.1]]))
    b.output(b.layer("l").neuron([x[0]]))
    module = neurovec.compile(b.build()).double()
    assert module().item() == 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    graph = fig41.fig41_graph()
    module = neurovec.compile(graph)
    torch.testing.assert_close(module.to("cuda")().cpu(), module.to("cpu")())


def test_a_pass_that_breaks_an_index_in_place_of_another_is_caught(monkeypatch):
    """The pipeline checks each program against the last one that verified (Program.verify's
    ``unchanged_since``): a pass that keeps a gather's node but swaps its index array for one
    out of range must still be caught, and named."""
    from neurovec.compiler import build_program, pipeline
    from neurovec.compiler.ir import IRError, Op

    def breaks_a_gather(program, settings):
        gather = next(n for n in program.nodes if n.op is Op.GATHER)
        index = program.constants[gather.attrs["index"]]
        return program.replace(constants={**program.constants, gather.attrs["index"]: index + 10 ** 6})

    passes = list(pipeline.PIPELINE)
    passes.insert(3, ("breaks_a_gather", lambda settings: True, breaks_a_gather))
    monkeypatch.setattr(pipeline, "PIPELINE", passes)
    with pytest.raises(IRError, match="after pass 'breaks_a_gather'.*GATHER index out of range"):
        build_program(fig41.fig41_graph(), "default")


def test_compiling_twice_gives_the_same_names(mutagenesis_dir):
    # Names numbered by a process-wide count gave relational Mutagenesis ("dims") other constant
    # keys the second time it was compiled in a process (idx_output_6 -> idx_output_7): a name is
    # numbered by the names already taken now (rewrite.unique_name), never by a count.
    pytest.importorskip("sqlalchemy")
    from neurovec.compiler.pipeline import build_program
    data = neurovec.datasets.load_mutagenesis(mutagenesis_dir)
    graph = neurovec.datasets.mutagenesis_dims(data, 3, 1, seed=0)
    first, second = build_program(graph), build_program(graph)
    assert list(first.constants) == list(second.constants)
    assert [n.attrs for n in first.nodes] == [n.attrs for n in second.nodes]
