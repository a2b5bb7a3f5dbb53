"""The engines a benchmark compares, behind one small interface.

An :class:`Engine` is built for a task (the build is timed as its compile time),
asked for its outputs and gradients (checked against the task's oracle), then
run iteration by iteration under a :class:`~neurovec.benchmarks.measure.Stopwatch`.

Torch engines (:class:`TorchEngine`) share one training iteration: zero the
gradients, ``forward`` (lap ``forward``), MSE loss and ``backward`` (lap
``backward``), an Adam step (lap ``optimizer``). The training step is the sum of
the three laps; device synchronisation ends each lap.

* :class:`NeurovecEngine`: ``neurovec`` compiled with one preset (verification off:
  the benchmark checks outputs itself, and the verifier is not part of compiling);
* :class:`PyGEngine`: the PyTorch Geometric twin of a GNN template, same weights;
* :class:`ReferenceEngine`: the neuron-by-neuron reference engine (small graphs only);
* :class:`AutotuneEngine`: whatever ``neurovec.autotune`` picks, tuning time counted
  as compile time.

NeuraLogic's own engine lives in :mod:`neurovec.benchmarks.neuralogic_models`.
"""
from __future__ import annotations

import numpy as np
import torch

import neurovec
from neurovec.compiler import Settings, build_program
from neurovec.engines.reference import ReferenceModule
from neurovec.engines.torch_module import CompiledModule

from .measure import MemoryProbe, Stopwatch
from .tasks import TU_DATASETS, Task, mse

__all__ = ["Skipped", "Engine", "TorchEngine", "NeurovecEngine", "PyGEngine", "ReferenceEngine", "AutotuneEngine"]


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

    def outputs(self) -> np.ndarray:
        """The current outputs, ``(n_samples, ...)`` in float64 on the CPU."""
        raise NotImplementedError

    def gradients(self) -> dict | None:
        """Gradients of the training loss by weight name, at the current weights (None: not available)."""
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
        self.labels = task.labels_tensor(device, dtype)
        self.optimizer = torch.optim.Adam(list(params.values()), lr=self.learning_rate)

    def forward(self) -> torch.Tensor:
        raise NotImplementedError

    def outputs(self) -> np.ndarray:
        with torch.no_grad():
            out = self.forward()
        return out.detach().to("cpu", torch.float64).numpy().reshape(self.n_samples, -1)

    def gradients(self) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        mse(self.forward(), self.labels).backward()
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
        mse(out, self.labels).backward()
        watch.lap("backward")
        self.optimizer.step()
        watch.lap("optimizer")

    def close(self) -> None:
        self.__dict__.pop("module", None)
        self.__dict__.pop("optimizer", None)
        self.__dict__.pop("params", None)


class NeurovecEngine(TorchEngine):
    """``neurovec.compile(task.graph, preset)``: build_program (per-pass times kept) + CompiledModule."""

    kind = "neurovec"

    def __init__(self, preset: str, name: str | None = None):
        super().__init__(name or preset)
        self.settings = Settings.preset(preset, verify=False)

    def build(self, task, device, dtype) -> dict:
        if task.graph is None:
            raise Skipped("no neurovec graph for this task (see the task notes)")
        passes: dict[str, float] = {}
        program = build_program(task.graph, self.settings, passes)
        self.module = CompiledModule(program, dtype).to(device)
        self._prepare(dict(self.module.weights.named_parameters()), task, device, dtype)
        return {"passes_s": passes, "program_nodes": len(program.nodes)}

    def forward(self) -> torch.Tensor:
        return self.module()


class PyGEngine(TorchEngine):
    """The PyG twin of a TU GNN template, with the template's initial weights."""

    kind = "pyg"

    def __init__(self, name: str = "pyg"):
        super().__init__(name)

    def build(self, task, device, dtype) -> dict:
        if task.dataset not in TU_DATASETS or task.source != "template":
            raise Skipped("PyG twins exist only for the GNN templates on TU datasets")
        try:
            from neurovec.datasets.pyg_twins import copy_weights, make_twin, pyg_batch
            self.module = make_twin(task.spec)
        except ImportError as error:
            raise Skipped(f"torch_geometric is not installed ({error}); pip install 'neurovec[pyg]'") from None
        copy_weights(ReferenceModule(task.graph, torch.float64), self.module)
        self.module = self.module.to(device=device, dtype=dtype)
        x, edge_index, batch, n = pyg_batch(task.data, task.samples, dtype=dtype)
        self.inputs = (x.to(device), edge_index.to(device), batch.to(device), n)
        self._prepare(dict(self.module.named_parameters()), task, device, dtype)
        return {}

    def forward(self) -> torch.Tensor:
        return self.module(*self.inputs)

    def close(self) -> None:
        super().close()
        self.__dict__.pop("inputs", None)


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
    to get the module. The winner and every candidate's row go to the results.
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
