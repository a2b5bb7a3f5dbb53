"""The engines a benchmark compares, behind one small interface.

An :class:`Engine` is built for a task (timed), runs a first forward and backward
pass (timed: lazy work such as ``torch.compile`` and PyG's cached normalisation
happens here; build + first pass is the engine's compile time), is asked for its
outputs and gradients (checked against the task's oracle), then runs iteration by
iteration under a :class:`~neurovec.benchmarks.measure.Stopwatch`.

Torch engines (:class:`TorchEngine`) share one training iteration: zero the
gradients, ``forward`` (lap ``forward``), MSE loss and ``backward`` (lap
``backward``), an Adam step (lap ``optimizer``; torch's fused Adam where it has one for the
weights, as a skilled user runs it: one kernel for all weights instead of a few ops per weight, which
shortens every contender's step alike). The training step is the sum of
the three laps; device synchronisation ends each lap.

* :class:`NeurovecEngine`: ``neurovec.compile`` with one preset (verification off:
  the benchmark checks outputs itself, and the verifier is not part of compiling);
* :class:`PyGEngine`: the PyTorch Geometric twin of a GNN template, same weights,
  in one of three configurations (:data:`PYG_VARIANTS`): ``pyg`` as the twin is
  written, ``pyg-tuned`` with ``GCNConv(cached=True)`` and a sparse ``adj_t``,
  ``pyg-compiled`` under ``torch.compile``;
* :class:`ReferenceEngine`: the neuron-by-neuron reference engine (small graphs only);
* :class:`AutotuneEngine`: whatever ``neurovec.autotune`` picks, tuning time counted
  as compile time.

The harness uses neurovec's public API only (``neurovec.compile``,
``neurovec.autotune``, ``Settings.preset``), so that it measures what a user gets
and keeps working while the compiler's internals change.

NeuraLogic's own engine lives in :mod:`neurovec.benchmarks.neuralogic_models`.
"""
from __future__ import annotations

import numpy as np
import torch

import neurovec
from neurovec import ReferenceModule, Settings

from .measure import MemoryProbe, Stopwatch
from .tasks import TU_DATASETS, Task, mse, template_weights

__all__ = ["adam", "Skipped", "Engine", "TorchEngine", "NeurovecEngine", "PyGEngine", "ReferenceEngine", "AutotuneEngine",
           "PYG_VARIANTS", "warm_up_torch_compile"]


def adam(params: list, lr: float) -> torch.optim.Adam:
    """Adam, fused (one kernel for every weight) where torch has a fused Adam for these tensors.

    On CPU a step over the ten-odd small weights of a GNN costs about 0.25 ms as a loop of ops per
    weight and a quarter of that fused: on MUTAG, a tenth of the whole training step."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, ValueError):  # e.g. a device or dtype without a fused kernel
        return torch.optim.Adam(params, lr=lr)


class Skipped(Exception):
    """This engine cannot run on this task or machine; the message says why (reported, not an error)."""


class Engine:
    """One contender. Subclasses set ``kind`` and implement the four methods."""

    kind = "custom"
    device_note: str | None = None  # set when the engine ignores the requested device

    def __init__(self, name: str):
        self.name = name

    def build(self, task: Task, device: torch.device, dtype: torch.dtype) -> dict:
        """Prepare everything a training iteration needs; returns details for the results file.

        A returned ``"build_s"`` replaces the measured build time (for engines built earlier).
        """
        raise NotImplementedError

    def first_pass(self) -> None:
        """One forward and backward pass without an optimizer step: whatever the engine does lazily."""

    def build_details(self) -> dict:
        """What the first pass found out (e.g. the graphs ``torch.compile`` made), for the results file."""
        return {}

    def outputs(self) -> np.ndarray:
        """The current outputs, ``(n_samples, ...)`` in float64 on the CPU."""
        raise NotImplementedError

    def gradients(self, positions: np.ndarray | None = None) -> dict | None:
        """Gradients of the training loss by weight name, at the current weights (None: not available).

        ``positions``: the loss over those sample positions only (a subset oracle).
        """
        return None

    def iteration(self, watch: Stopwatch, probe: MemoryProbe) -> None:
        """One training iteration, split into stopwatch laps (``forward``, ``backward``, ``optimizer``...)."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop references to big objects so the next engine starts from clean memory."""


class TorchEngine(Engine):
    """An engine that is a torch module: subclasses set ``self.params`` and implement ``forward``."""

    learning_rate = 1e-3

    def _prepare(self, params: dict, task: Task, device: torch.device, dtype: torch.dtype) -> None:
        self.params = params
        self.n_samples = task.n_samples
        self.loss = task.loss_fn(device, dtype)
        self.device = device
        self.optimizer = adam(list(params.values()), self.learning_rate)

    def forward(self) -> torch.Tensor:
        raise NotImplementedError

    def first_pass(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.loss(self.forward()).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def outputs(self) -> np.ndarray:
        # With autograd on, as in training: a torch.compile'd module then reuses its training graph.
        out = self.forward()
        return out.detach().to("cpu", torch.float64).numpy().reshape(self.n_samples, -1)

    def gradients(self, positions: np.ndarray | None = None) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        index = None if positions is None else torch.as_tensor(positions, device=self.device)
        self.loss(self.forward(), index).backward()
        grads = {name: p.grad.detach().to("cpu", torch.float64).numpy().copy()
                 for name, p in self.params.items() if p.grad is not None}
        self.optimizer.zero_grad(set_to_none=True)
        return grads

    def iteration(self, watch: Stopwatch, probe: MemoryProbe) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        out = self.forward()
        watch.lap("forward")
        probe.sample()  # activations are alive now: the likely peak
        watch.resume()
        self.loss(out).backward()
        watch.lap("backward")
        self.optimizer.step()
        watch.lap("optimizer")

    def close(self) -> None:
        self.__dict__.pop("module", None)
        self.__dict__.pop("optimizer", None)
        self.__dict__.pop("params", None)


class NeurovecEngine(TorchEngine):
    """``neurovec.compile(task.graph, preset)``, moved to the device."""

    kind = "neurovec"

    def __init__(self, preset: str, name: str | None = None):
        super().__init__(name or preset)
        self.settings = Settings.preset(preset, verify=False)

    def build(self, task, device, dtype) -> dict:
        if task.graph is None:
            raise Skipped("no neurovec graph for this task (see the task notes)")
        self.module = neurovec.compile(task.graph, self.settings, dtype).to(device)
        self._prepare(dict(self.module.weights.named_parameters()), task, device, dtype)
        program = getattr(self.module, "program", None)
        return {"program_nodes": len(program.nodes)} if hasattr(program, "nodes") else {}

    def forward(self) -> torch.Tensor:
        return self.module()


#: The PyG contenders: ``(GCN cached, adjacency format, torch.compile)``. ``csr`` is a
#: transposed sparse adjacency ``adj_t`` (``torch.sparse_csr_tensor``, row = target):
#: PyG 2.8 without torch_sparse takes torch.sparse COO/CSR and its ``EdgeIndex`` in
#: every conv. On PROTEINS (1 thread) CSR was the fastest eager format for GCN, SAGE
#: and GIN (COO close behind, ``EdgeIndex`` and plain ``edge_index`` 1.3-1.8x slower),
#: so ``pyg-tuned`` uses it. ``torch.compile`` cannot trace torch.sparse products (GCN and
#: SAGE break into 4-5 graphs and gain nothing over eager CSR) but fuses the gather and
#: scatter of the ``edge_index`` path into one graph, 2.5-4x faster than eager; so
#: ``pyg-compiled`` compiles the cached ``edge_index`` configuration (docs/benchmarks.md).
PYG_VARIANTS = {"pyg": (False, "edge_index", False), "pyg-tuned": (True, "csr", False),
                "pyg-compiled": (True, "edge_index", True)}


class PyGEngine(TorchEngine):
    """The PyG twin of a TU GNN template, with the template's initial weights, in one of :data:`PYG_VARIANTS`."""

    kind = "pyg"

    def __init__(self, name: str = "pyg"):
        if name not in PYG_VARIANTS:
            raise ValueError(f"unknown PyG contender {name!r} (expected one of {', '.join(PYG_VARIANTS)})")
        super().__init__(name)
        self.cached, self.adjacency, self.compiled = PYG_VARIANTS[name]

    def build(self, task, device, dtype) -> dict:
        if hasattr(task, "pyg_inputs"):  # a node task: one large graph
            return self._build_node(task, device, dtype)
        if task.dataset not in TU_DATASETS or task.source != "template":
            raise Skipped("PyG twins exist only for the GNN templates on TU and node datasets")
        try:
            from neurovec.datasets.pyg_twins import copy_weights, make_twin, pyg_batch
            twin = make_twin(task.spec)
        except ImportError as error:
            raise Skipped(f"torch_geometric is not installed ({error}); pip install 'neurovec[pyg]'") from None
        copy_weights(template_weights(task), twin)
        twin = twin.to(device=device, dtype=dtype)
        if self.cached and task.model == "gcn":
            for conv in _convs(twin):
                conv.cached = True  # the normalised adjacency is computed once, in the first pass
        x, edge_index, batch, n = pyg_batch(task.data, task.samples, dtype=dtype)
        adjacency = edge_index.to(device)
        if self.adjacency == "csr":
            from torch_geometric.utils import to_torch_csr_tensor
            adjacency = to_torch_csr_tensor(adjacency.flip(0), size=(x.shape[0], x.shape[0]))
        self.inputs = (x.to(device), adjacency, batch.to(device), n)
        self._prepare(dict(twin.named_parameters()), task, device, dtype)
        self.twin, self.task_model = twin, task.model
        if self.compiled:
            torch._dynamo.reset()  # every task compiles afresh, never into an earlier task's cache limit
            self.module = torch.compile(twin)
        else:
            self.module = twin
        return {"cached": self.cached and task.model == "gcn", "adjacency": self.adjacency,
                "torch_compile": self.compiled}

    def _build_node(self, task, device, dtype) -> dict:
        try:
            from neurovec.datasets.pyg_twins import copy_weights, make_twin
            twin = make_twin(task.spec)
        except ImportError as error:
            raise Skipped(f"torch_geometric is not installed ({error}); pip install 'neurovec[pyg]'") from None
        copy_weights(task.template_weights(), twin)
        twin = twin.to(device=device, dtype=dtype)
        if self.cached and task.model == "gcn":
            for conv in _convs(twin):
                conv.cached = True
        self.inputs, details = task.pyg_inputs(self.name, device, dtype)
        self._prepare(dict(twin.named_parameters()), task, device, dtype)
        self.twin, self.task_model = twin, task.model
        if self.compiled:
            torch._dynamo.reset()
            self.module = torch.compile(twin)
        else:
            self.module = twin
        return {"cached": self.cached and task.model == "gcn", "adjacency": self.adjacency,
                "torch_compile": self.compiled, **details}

    def first_pass(self) -> None:
        if not self.compiled:
            return super().first_pass()
        from torch._dynamo.utils import counters
        if self.cached and self.task_model == "gcn":
            with torch.no_grad():  # fill GCNConv's cache eagerly: compiled, the empty cache would break the graph
                self.twin(*self.inputs)
        counters.clear()
        with _fresh_inductor_cache():
            super().first_pass()
        # Which graphs dynamo made: a graph break or an eager fallback would be silent otherwise.
        self.compile_stats = {"graphs": int(counters["stats"]["unique_graphs"]),
                              "graph_breaks": int(sum(counters["graph_break"].values()))}

    def forward(self) -> torch.Tensor:
        return self.module(*self.inputs)

    def build_details(self) -> dict:
        return getattr(self, "compile_stats", {})

    def close(self) -> None:
        super().close()
        self.__dict__.pop("inputs", None)
        self.__dict__.pop("twin", None)
        if self.compiled:
            torch._dynamo.reset()


def _fresh_inductor_cache():
    """A new, empty inductor cache: the compile time is a cold compile, whatever ran before.

    Without it a later task with the same shapes (labels and continuous features)
    or an earlier run would load the compiled kernels from the cache. Falls back to
    the default cache where torch has no ``fresh_cache``.
    """
    try:
        from torch._inductor.utils import fresh_cache
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return fresh_cache()


def warm_up_torch_compile() -> None:
    """Compile a tiny function once, so that importing and initialising inductor is nobody's compile time."""
    x = torch.ones(8, requires_grad=True)
    with _fresh_inductor_cache():
        torch.compile(lambda t: (t * 2).relu().sum())(x).backward()
    torch._dynamo.reset()


def _convs(twin: torch.nn.Module) -> list:
    return [module for name, module in twin.named_children() if name.startswith("conv")]


class ReferenceEngine(TorchEngine):
    """neurovec's reference engine, timed like the others; refused above ``max_neurons``."""

    kind = "reference"

    def __init__(self, max_neurons: int = 20_000, name: str = "reference"):
        super().__init__(name)
        self.max_neurons = max_neurons

    def build(self, task, device, dtype) -> dict:
        if task.graph is None:
            raise Skipped("no neurovec graph for this task")
        if task.graph.n_neurons > self.max_neurons:
            raise Skipped(f"{task.graph.n_neurons} neurons > --reference-max-neurons {self.max_neurons} "
                          "(the reference engine evaluates neuron by neuron)")
        self.module = ReferenceModule(task.graph, dtype).to(device)
        self._prepare(dict(self.module.weights.named_parameters()), task, device, dtype)
        return {}

    def forward(self) -> torch.Tensor:
        return self.module()


class AutotuneEngine(TorchEngine):
    """``neurovec.autotune``: times candidate presets and kernels, returns the winner's module.

    Its whole tuning time is this engine's compile time: that is what a user pays
    to get the module. The winner and every candidate's row go to the results. The
    winner is then timed like every other engine, interleaved with them: its step
    in the results is that measurement, not autotune's own.
    ``presets`` None: autotune's own candidate list, what a user gets by default.
    """

    kind = "autotune"

    def __init__(self, presets: list[str] | None = None, budget_s: float = 60.0, name: str = "autotune"):
        super().__init__(name)
        self.presets = presets
        self.budget_s = budget_s

    def build(self, task, device, dtype) -> dict:
        autotune = getattr(neurovec, "autotune", None)
        if autotune is None:
            raise Skipped("neurovec.autotune is not available in this version of neurovec")
        if task.graph is None:
            raise Skipped("no neurovec graph for this task")
        result = autotune(task.graph, presets=self.presets, device=device, budget_s=self.budget_s, dtype=dtype)
        self.module = result.module.to(device)
        self._prepare(dict(self.module.weights.named_parameters()), task, device, dtype)
        return {"chosen": f"{result.preset}/{result.kernel}", "candidates": result.table.as_records()}

    def forward(self) -> torch.Tensor:
        return self.module()
