"""Compiled modules behave like any ``nn.Module``: pickling and ``torch.save``, state
dicts that move between samples, dtypes, settings given as a dict (issue 11, item 5)."""
from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import neurovec
from neurovec import datasets
from neurovec.engines.torch_module import CompiledModule

from .equivalence import assert_equivalent

PRESETS = ["unoptimized", "default", "upward-17-aggressive"]


@pytest.fixture(scope="module")
def mutag(tu_dir):
    return datasets.load_tu("MUTAG", tu_dir)


@pytest.fixture(scope="module")
def tiny_gcn(mutag):
    return datasets.gcn(mutag, hidden=8, layers=2, samples=[0, 1, 2, 3])


def _outputs_and_grads(module):
    out = module()
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    projection = projection.to(out.dtype)
    grads = torch.autograd.grad((out * projection).sum(), list(module.parameters()))
    return out.detach(), grads


def _assert_identical(a, b):
    out_a, grads_a = _outputs_and_grads(a)
    out_b, grads_b = _outputs_and_grads(b)
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b)
    for g_a, g_b in zip(grads_a, grads_b):
        assert torch.equal(g_a, g_b)


def _torch_save_load(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)  # a whole module is code, not weights only


# -- pickling -------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["pickle", "torch.save", "deepcopy"])
@pytest.mark.parametrize("settings", PRESETS + [{"reduce_kernel": "sparse_mm"}])
def test_round_trip_gives_identical_outputs_and_gradients(tiny_gcn, settings, how):
    module = neurovec.compile(tiny_gcn, settings, torch.float64)
    with torch.no_grad():  # trained weights, not the initial ones, must come back
        for p in module.parameters():
            p.add_(0.25)
    again = {"pickle": lambda m: pickle.loads(pickle.dumps(m)), "torch.save": _torch_save_load,
             "deepcopy": copy.deepcopy}[how](module)
    assert isinstance(again, CompiledModule) and type(again) is not type(module)
    assert again.code == module.code
    assert again.state_dict().keys() == module.state_dict().keys()
    _assert_identical(module, again)
    # The copy is independent: training one leaves the other alone.
    with torch.no_grad():
        next(again.parameters()).add_(1.0)
    assert not torch.equal(again(), module())


def test_saved_module_loads_in_a_fresh_process(tiny_gcn, tmp_path):
    module = neurovec.compile(tiny_gcn, "default", torch.float64)
    torch.save(module, tmp_path / "module.pt")
    torch.save(module().detach(), tmp_path / "expected.pt")
    script = ("import sys, torch; m = torch.load(sys.argv[1], weights_only=False); "
              "e = torch.load(sys.argv[2]); assert torch.equal(m(), e), 'outputs differ'; "
              "assert 'def forward' in m.code; print(type(m).__name__)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "module.pt"), str(tmp_path / "expected.pt")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "CompiledModule"


def test_each_program_has_its_own_forward(tiny_gcn):
    a = neurovec.compile(tiny_gcn)
    b = neurovec.compile(tiny_gcn)
    assert a.code == b.code
    # torch.compile caches compiled code per code object: two modules must not share one.
    assert type(a).forward.__code__ is not type(b).forward.__code__
    assert "def forward(self, facts=None):" in a.code
    assert repr(a).startswith("CompiledModule(")


# -- state dicts ----------------------------------------------------------------------------------

def test_state_dict_moves_between_modules_compiled_on_different_samples(mutag):
    # Different samples have different node degrees, hence different fixed GCN
    # normalisation scalars (weights.gcn_norm.deg*): those are not state.
    graph_a = datasets.gcn(mutag, hidden=8, layers=2, samples=[0, 1, 2, 3], seed=0)
    graph_b = datasets.gcn(mutag, hidden=8, layers=2, samples=[17, 18, 19], seed=1)
    fixed_a = {w.name for w in graph_a.weights if not w.learnable}
    fixed_b = {w.name for w in graph_b.weights if not w.learnable}
    assert fixed_a != fixed_b  # the test needs samples whose fixed weights differ
    a = neurovec.compile(graph_a, dtype=torch.float64)
    b = neurovec.compile(graph_b, dtype=torch.float64)
    learnable = {f"weights.{w.name}" for w in graph_a.weights if w.learnable}
    assert set(a.state_dict()) == learnable == set(b.state_dict())
    before = b()
    b.load_state_dict(a.state_dict())  # strict
    for name, value in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], value)
    for w in graph_b.weights:  # b keeps its own fixed weights
        if not w.learnable:
            assert torch.equal(b.weights[w.name], torch.tensor(w.value))
    assert not torch.equal(b(), before)
    # b now computes graph_b under a's weights: the reference engine agrees.
    shared = neurovec.ReferenceModule(graph_b)
    shared.load_state_dict(a.state_dict(), strict=False)
    torch.testing.assert_close(b(), shared(), rtol=1e-9, atol=1e-9)


# -- dtypes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, "float32"])
def test_non_float_dtype_is_refused_at_compile_time(tiny_gcn, dtype):
    with pytest.raises(TypeError, match="dtype must be one of torch.float32, torch.float64"):
        neurovec.compile(tiny_gcn, dtype=dtype)


# Tolerances of half precision: bfloat16 keeps ~3 significant digits, and GIN's gradients go
# through an MLP per layer (normalised errors ~0.1 even unoptimized).
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-2), (torch.bfloat16, 2.5e-1)])
@pytest.mark.parametrize("template", ["gcn", "sage", "gin"])
def test_half_precision_runs_every_preset_and_kernel(mutag, template, dtype, tol):
    graph = getattr(datasets, template)(mutag, hidden=8, layers=2, samples=list(range(20)))
    exact = neurovec.compile(graph, "unoptimized", torch.float64)
    out_exact, grads_exact = _outputs_and_grads(exact)
    choices = [neurovec.Settings.preset(p) for p in neurovec.list_presets()]
    choices += [neurovec.Settings(reduce_kernel=k) for k in ("scatter", "segment", "dense", "sparse_mm")]
    for settings in choices:
        module = neurovec.compile(graph, settings, dtype)
        assert next(module.parameters()).dtype == dtype
        out, grads = _outputs_and_grads(module)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), out_exact, rtol=tol, atol=tol)
        # Errors relative to the largest gradient: a bias gradient is a sum of hundreds of
        # terms that may cancel, and half precision's error scales with the terms, not the sum.
        scale = max(g.abs().max().item() for g in grads_exact) + 1e-3
        for g, g_exact in zip(grads, grads_exact):
            torch.testing.assert_close(g.double() / scale, g_exact / scale, rtol=tol, atol=tol)


# -- settings -------------------------------------------------------------------------------------

def test_settings_may_be_a_dict(tiny_gcn):
    from_dict = neurovec.compile(tiny_gcn, {"upward": False, "reduce_kernel": "segment"}, torch.float64)
    from_model = neurovec.compile(tiny_gcn, neurovec.Settings(upward=False, reduce_kernel="segment"), torch.float64)
    assert from_dict.code == from_model.code
    assert_equivalent(tiny_gcn, from_dict)


def test_unknown_settings_are_named(tiny_gcn):
    with pytest.raises(ValueError, match=r"unknown settings 'upwards' \(did you mean 'upward'\?\)"):
        neurovec.compile(tiny_gcn, {"upwards": False})
    with pytest.raises(TypeError, match="settings must be a neurovec.Settings, a preset name, a dict"):
        neurovec.compile(tiny_gcn, 3)
    with pytest.raises(ValueError, match="unknown preset 'defualt'"):
        neurovec.compile(tiny_gcn, "defualt")


def test_gathers_with_a_backward_index_in_int64(tu_dir):
    """The backward of index_select is index_add_, ~20x slower on CPU with an int32 index:
    the indices of gathers from computed values are int64 buffers, those of gathers from
    constant facts stay int32 (half the memory)."""
    import neurovec
    from neurovec import datasets
    from neurovec.compiler.ir import Op
    graph = datasets.sage(datasets.load_tu("MUTAG", tu_dir, download=False))
    module = neurovec.compile(graph, "unoptimized")
    nodes = module.program.by_name()
    # (a gather of one row is an expand, with no index buffer)
    gathers = [n for n in module.program.nodes if n.op is Op.GATHER and n.attrs["index"] in module._buffers]
    computed = [n for n in gathers if nodes[n.srcs[0]].op is not Op.FACT]
    from_facts = [n for n in gathers if nodes[n.srcs[0]].op is Op.FACT]
    assert computed and from_facts
    assert all(getattr(module, n.attrs["index"]).dtype == torch.int64 for n in computed)
    assert all(getattr(module, n.attrs["index"]).dtype == torch.int32 for n in from_facts
               if n.attrs["index"] not in {m.attrs["index"] for m in computed})


# -- weight names ---------------------------------------------------------------------------------

# Names of nn.Module's own methods and state, alone and as dotted parts (issue 23, item 9).
ATTRIBUTE_NAMES = ["half", "train", "to", "cuda", "forward", "training", "_parameters", "keys",
                   "a.half", "state_dict.training", "_modules.b"]


def _graph_with_weight_names(names, fixed=("cuda",)):
    rng = np.random.default_rng(0)
    b = neurovec.GraphBuilder()
    x = b.facts("x", rng.normal(size=(4, 3)))
    h = b.layer("h", aggregation="sum", transformation="tanh")
    weights = [b.weight(name, rng.normal(size=(3, 3)), learnable=name not in fixed) for name in names]
    bias = b.weight("bias.to", rng.normal(size=3))
    b.output(*[h.neuron([(x[k % 4], w), (x[(k + 1) % 4], weights[k - 1])], bias=bias)
               for k, w in enumerate(weights)])
    return b.build()


@pytest.mark.parametrize("preset", PRESETS)
def test_weights_may_have_the_names_of_module_attributes(preset):
    graph = _graph_with_weight_names(ATTRIBUTE_NAMES)
    module = neurovec.compile(graph, preset, torch.float64)
    reference = neurovec.ReferenceModule(graph)
    learnable = {f"weights.{w.name}" for w in graph.weights if w.learnable}
    assert set(module.state_dict()) == learnable == set(reference.state_dict())
    assert module.weights["half"] is dict(module.named_parameters())["weights.half"]
    assert_equivalent(graph, module)
    # The module's own methods and state still work beside weights of those names.
    module.train(False)
    assert not module.training and not module.weights.training
    module.train()
    assert module.weights.training
    module.half().double()  # the fixed 'cuda' comes back exact, the learnable ones are float16-rounded
    assert torch.equal(module.weights["cuda"], torch.tensor(graph.weights[ATTRIBUTE_NAMES.index("cuda")].value))
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.5)
    module.load_state_dict(reference.state_dict())
    torch.testing.assert_close(module(), reference(), rtol=1e-9, atol=1e-9)
    _assert_identical(module, pickle.loads(pickle.dumps(module)))


def test_weights_named_like_attributes_are_shared_by_a_mini_batch_model():
    graph = _graph_with_weight_names(ATTRIBUTE_NAMES, fixed=())
    model = neurovec.MiniBatchModel(lambda samples: graph, dtype=torch.float64)
    batch = model.batch([0])
    assert batch.program.weights["half"] is model.weights["half"]
    torch.testing.assert_close(model(batch), neurovec.ReferenceModule(graph)(), rtol=1e-9, atol=1e-9)


def test_a_weight_that_is_a_prefix_of_another_is_named():
    with pytest.raises(neurovec.GraphError, match=r"weight name 'a.half' clashes with weight 'a'.*rename one"):
        neurovec.compile(_graph_with_weight_names(["a", "a.half"]))


def test_load_state_dict_of_another_shape_names_the_weight(mutag):
    small = neurovec.compile(datasets.gcn(mutag, hidden=8, layers=2, samples=[0, 1]), dtype=torch.float64)
    wide = datasets.gcn(mutag, hidden=16, layers=2, samples=[0, 1])
    key = next(k for k, v in small.state_dict().items() if v.ndim == 2)
    name = key.removeprefix("weights.")
    expected_shape = tuple(small.weights[name].shape)
    for target in (neurovec.compile(wide), neurovec.ReferenceModule(wide)):
        before = {k: v.clone() for k, v in target.state_dict().items()}
        shape = tuple(target.weights[name].shape)
        with pytest.raises(neurovec.GraphError, match=rf"load_state_dict: weight {name!r} \(key {key!r}\) has shape "
                                                      rf"\({expected_shape[0]}, {expected_shape[1]}\) in the state "
                                                      rf"dict, but \({shape[0]}, {shape[1]}\) in this module's graph; "
                                                      r"load weights trained on a graph built by the same template"):
            target.load_state_dict(small.state_dict(), strict=False)
        for k, v in target.state_dict().items():  # nothing was loaded
            assert torch.equal(v, before[k])
    # torch would turn a (1,) tensor into a scalar weight without a word.
    b = neurovec.GraphBuilder()
    scale, x = b.weight("scale", 2.0), b.facts("x", np.ones((2, 3)))
    b.output(b.layer("h").neuron([(x[0], scale), (x[1], scale)]))
    module = neurovec.compile(b.build())
    with pytest.raises(neurovec.GraphError, match=r"weight 'scale' \(key 'weights.scale'\) has shape \(1,\) in the "
                                                  r"state dict, but \(\) in this module's graph"):
        module.load_state_dict({"weights.scale": torch.tensor([3.0])})
    assert module.weights["scale"].item() == 2.0


def test_sparse_sums_keep_one_copy_of_their_matrix():
    """GCN's layers sum over the same normalised adjacency: the module keeps one CSR for all of
    them (not one per layer), and no second copy of a sparse sum's indices, coefficients or
    segment ids as buffers that its code never reads; it gives the reference's values, in float32
    after .float() too (the shared CSR's values follow the dtype once)."""
    import neurovec
    from neurovec.compiler.ir import Op
    from neurovec.datasets import gnn
    from neurovec.datasets.synthetic import rmat_dataset
    from neurovec.engines.reference import ReferenceModule
    data = rmat_dataset(nodes=200, edges=2000, features=5, classes=3, undirected=True, split=(0.5, 0.25, 0.25))
    graph = gnn.build_gnn(data, gnn.GNNSpec.create("gcn", data, 8, 4), None, 0)
    module = neurovec.compile(graph, "default", dtype=torch.float64)
    sparse = [n for n in module.program.nodes if n.op is Op.REDUCE and module.reduce_kernels[n.name] == "sparse_mm"]
    assert len(sparse) == 3 and len({id(getattr(module, f"csr_{n.name}")) for n in sparse}) == 1
    for node in sparse:
        assert not {node.attrs["index"], node.attrs.get("coef"), f"seg_{node.attrs['counts']}"} & set(module._buffers)
        index = getattr(module, node.attrs["index"])  # still there by name, made on request
        assert index.dtype == torch.int32 and index.tolist() == module.program.constants[node.attrs["index"]].tolist()
    expected = ReferenceModule(graph)()
    torch.testing.assert_close(module(), expected, rtol=1e-9, atol=1e-9)
    assert module.csr_conv2_agg.values.dtype == torch.float64
    module.float()
    assert module.csr_conv2_agg.values.dtype == module.csr_conv2_agg.t_values.dtype == torch.float32
    torch.testing.assert_close(module().double(), expected, rtol=1e-4, atol=1e-5)
    module.double()
    torch.testing.assert_close(module(), expected, rtol=1e-6, atol=1e-6)  # weights stay float32 roundings


def _four_layer_gcn(edges: int):
    from neurovec.datasets import gnn
    from neurovec.datasets.synthetic import rmat_dataset
    data = rmat_dataset(nodes=300, edges=edges, features=5, classes=3, undirected=True, split=(0.5, 0.25, 0.25))
    return gnn.build_gnn(data, gnn.GNNSpec.create("gcn", data, 16, 4), None, 0)


def test_a_forward_frees_each_value_after_its_last_use(monkeypatch):
    """The generated forward deletes each large computed value after the statement that last
    reads it (NOTE: [dead values deleted]; here every value counts as large): at no point of a
    4-layer GCN's forward are more than three of its (n, 16) values alive (without the
    deletions, every one of them is alive at the end). Small values are left to the return."""
    import weakref

    from torch.overrides import TorchFunctionMode

    from neurovec.engines import torch_module
    graph = _four_layer_gcn(2000)
    assert "    del " not in neurovec.compile(graph, "default").code  # 300 x 16 values: small
    monkeypatch.setattr(torch_module, "_DELETED_FROM", 0)
    module = neurovec.compile(graph, "default", dtype=torch.float64)

    class Alive(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.made, self.most = [], 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.most = max(self.most, sum(ref() is not None for ref in self.made))
            if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] > 250 and out.shape[1] == 16:
                self.made.append(weakref.ref(out))
            return out

    with torch.no_grad(), Alive() as alive:
        module()
    assert len(alive.made) >= 8 and alive.most <= 3, (len(alive.made), alive.most, module.code)
    assert "    del " in module.code
    from neurovec.engines.reference import ReferenceModule
    torch.testing.assert_close(module(), ReferenceModule(graph)(), rtol=1e-9, atol=1e-9)


def test_equal_constants_are_kept_once():
    """The layers of a GCN read the same edge indices and coefficients under names of their own:
    the module's program keeps one array for all of them."""
    from neurovec.compiler import build_program
    graph = _four_layer_gcn(8000)
    program = build_program(graph, neurovec.compiler.Settings.preset("default"))
    module = CompiledModule(program, torch.float64)
    equal = [(a, b) for a in program.constants for b in program.constants
             if a < b and program.constants[a].size >= 4096 and program.constants[a].shape == program.constants[b].shape
             and program.constants[a].dtype == program.constants[b].dtype
             and np.array_equal(program.constants[a], program.constants[b])]
    # Some are one array already (reduce_coefficients reuses a layer's coefficients for the next), the
    # edge indices are not: the module makes every equal pair one array.
    assert len(equal) >= 2 and any(program.constants[a] is not program.constants[b] for a, b in equal)
    assert all(module.program.constants[a] is module.program.constants[b] for a, b in equal)
    assert module.program.constants.keys() == program.constants.keys()
