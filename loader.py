"""Mini-batch training: one set of weights, many compiled batches, and a loader over samples.

    build = functools.partial(datasets.gcn, ds, hidden=32, seed=0)     # build(samples=ids) -> graph
    model = neurovec.MiniBatchModel(build, dtype=torch.float64)       # model.parameters(): the weights
    loader = neurovec.SampleLoader(model, train_ids, batch_size=32, shuffle=True, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(100):
        for batch in loader:                                         # a MiniBatch: .samples, .program
            loss = F.binary_cross_entropy(model(batch), y[batch.samples])
            opt.zero_grad(); loss.backward(); opt.step()

A neurovec module is compiled for one fixed set of samples, so every batch is its
own compiled program. :class:`MiniBatchModel` holds the learnable weights once
(``model.parameters()``, ``model.state_dict()``) and makes every batch program it
compiles read those same ``nn.Parameter`` objects: a step of the optimizer moves
every batch. Programs are cached by sample list, so a batch seen again costs no
compile.

NOTE: [Shuffling without recompiling] Compiling a 128-graph PROTEINS batch takes
0.2-0.5 s under the ``default`` preset (0.04-0.1 s ``unoptimized``, whose program
runs 5-30x slower), against a few milliseconds for its training step, so drawing
new batches every epoch would spend the epoch compiling
(``benchmarks/minibatch.py`` measures all three). :class:`SampleLoader` therefore
shuffles the samples once per *partition* (seeded), cuts that permutation into
batches, and compiles each batch once; every epoch visits the batches of a
partition in a new random order. The trade-off: with one partition (the default)
two samples that share a batch share it in every epoch, so the gradient noise of
SGD is that of a fixed partition, not of fresh batches. ``partitions=k`` cycles
through ``k`` independent partitions (epoch ``e`` uses partition ``e % k``), for
``k`` times the compile time and cached programs.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .compiling import compile as compile_graph
from .compiler.settings import Settings
from .engines.torch_module import CompiledModule
from .engines.weights import WeightStore
from .progress import Progress
from .sources.graph import Graph, GraphError

__all__ = ["MiniBatch", "MiniBatchModel", "SampleLoader"]

logger = logging.getLogger(__name__)

#: Compiling a loader's batches for longer than this shows a progress bar.
COMPILE_PROGRESS_DELAY_S = 3.0


class MiniBatch:
    """A compiled batch: ``program()`` returns the outputs of ``samples``, in order.

    ``global_size`` counts the samples of the whole optimizer step: in one process it
    is ``len(samples)``; under :mod:`neurovec.distributed` each rank holds a part of
    the step's batch and ``global_size`` is the size of all parts together.

    Immutable, and deliberately neither a dataclass nor a tensor container: training
    frameworks that walk a batch's fields (PyTorch Lightning's ``apply_to_collection``
    rebuilds dataclasses field by field, which a frozen one refuses, and would deep-copy
    the compiled program) pass it through unchanged. The model moves its programs to the
    weights' device itself.
    """

    __slots__ = ("_samples", "_program", "_global_size")

    def __init__(self, samples: np.ndarray, program: CompiledModule, global_size: int):
        object.__setattr__(self, "_samples", samples)
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_global_size", int(global_size))

    samples = property(lambda self: self._samples, doc="the sample ids, in output order")
    program = property(lambda self: self._program, doc="the compiled program of these samples")
    global_size = property(lambda self: self._global_size, doc="samples in the whole optimizer step")

    def __setattr__(self, name, value):
        raise AttributeError(f"MiniBatch is immutable (cannot set {name!r})")

    def __len__(self) -> int:
        return int(self._samples.size)

    def __repr__(self) -> str:
        return f"MiniBatch({_short(self._samples)}, global_size={self._global_size})"

    def __reduce__(self):
        return MiniBatch, (self._samples, self._program, self._global_size)


class MiniBatchModel(nn.Module):
    """The learnable weights of a template, shared by every batch it is compiled for.

    Args:
        build: ``build(samples=ids) -> neurovec.Graph``, the template over an int64
            array of sample ids (outputs in that order; called by keyword), e.g.
            ``functools.partial(datasets.gin, ds, hidden=32, seed=0)``. Every graph
            it returns must give each learnable weight the same initial value
            (templates do, for a fixed ``seed``).
        settings: compile settings or a preset name (default: ``"default"``).
        dtype: floating dtype of the weights and programs (default: torch's default).
        weights_from: the samples whose graph defines the learnable weights and their
            initial values (default: sample 0).
        cache: keep compiled programs, keyed by sample list (the loader relies on it).

    ``model(batch)`` takes a :class:`MiniBatch` or a sample list and returns the
    outputs ``(len(samples), *output_shape)``. Programs are moved to the weights'
    device and dtype when used, so ``model.to("cuda")`` moves everything.
    """

    def __init__(self, build: Callable[[np.ndarray], Graph], settings: Settings | str | None = None,
                 dtype: torch.dtype | None = None, weights_from: Sequence[int] = (0,), cache: bool = True):
        super().__init__()
        if not callable(build):
            raise TypeError(f"MiniBatchModel expects build(samples=...) -> neurovec.Graph (got {type(build).__name__})")
        self._build, self._cache = build, cache
        self._settings = Settings.preset(settings) if isinstance(settings, str) else settings
        graph = self._graph(np.asarray(weights_from, dtype=np.int64))
        learnable = [w for w in graph.weights if w.learnable]
        if not learnable:
            raise GraphError("MiniBatchModel: the template's graph has no learnable weights")
        self.weights = WeightStore(learnable, dtype)
        self._initial = {w.name: w.value for w in learnable}
        self._programs: dict[bytes, CompiledModule] = {}   # plain dict: not submodules, not in state_dict

    # -- compiling -----------------------------------------------------------------------------

    def batch(self, samples, global_size: int | None = None) -> MiniBatch:
        """The compiled batch of ``samples`` (from the cache if compiled before)."""
        samples = _as_ids(samples)
        key = samples.tobytes()
        program = self._programs.get(key)
        if program is None:
            program = self._compile(samples)
            if self._cache:
                self._programs[key] = program
        return MiniBatch(samples, program, len(samples) if global_size is None else int(global_size))

    @property
    def n_compiled(self) -> int:
        """How many batch programs are cached."""
        return len(self._programs)

    def clear_cache(self) -> None:
        self._programs.clear()

    def _graph(self, samples: np.ndarray) -> Graph:
        graph = self._build(samples=samples)
        if not isinstance(graph, Graph):
            raise TypeError(f"build(samples=...) must return a neurovec.Graph (got {type(graph).__name__})")
        return graph

    def _compile(self, samples: np.ndarray) -> CompiledModule:
        start = time.perf_counter()
        graph = self._graph(samples)
        self._check_weights(graph, samples)
        reference = next(iter(self.weights.parameters()))
        program = compile_graph(graph, self._settings, reference.dtype).to(reference.device)
        self._share(program)
        logger.debug("compiled a batch of %d samples in %.3f s", samples.size, time.perf_counter() - start)
        return program

    def _check_weights(self, graph: Graph, samples: np.ndarray) -> None:
        for w in graph.weights:
            if not w.learnable:
                continue
            if w.name not in self._initial:
                raise GraphError(f"the graph of samples {_short(samples)} has learnable weight {w.name!r}, which "
                                 f"the model (built from weights_from) does not have; build every batch from the "
                                 f"same template")
            if not np.array_equal(w.value, self._initial[w.name]):
                raise GraphError(f"the graph of samples {_short(samples)} gives weight {w.name!r} another initial "
                                 f"value than the model's: build every batch with the same seed")

    def _share(self, program: CompiledModule) -> None:
        """Make ``program`` read this model's parameters instead of its own copies."""
        ours = dict(self.weights.named_parameters())
        owners = dict(program.weights.named_modules())
        for name, _ in list(program.weights.named_parameters()):
            path, _, leaf = name.rpartition(".")
            setattr(owners[path], leaf, ours[name])
        shared = {id(p) for p in ours.values()}
        if any(id(p) not in shared for p in program.parameters()):
            raise RuntimeError("a batch program kept parameters of its own (neurovec.loader could not share them)")

    # -- running ---------------------------------------------------------------------------------

    def forward(self, batch: MiniBatch | Sequence[int] | np.ndarray, facts: dict | None = None) -> torch.Tensor:
        """The outputs of ``batch``; ``facts`` replaces dynamic fact layers for this call (e.g. dropout masks)."""
        if not isinstance(batch, MiniBatch):
            batch = self.batch(batch)
        program = batch.program
        reference = next(iter(self.weights.parameters()))
        if program.weights[next(iter(self._initial))] is not self.weights[next(iter(self._initial))]:
            raise ValueError("this MiniBatch was compiled by another MiniBatchModel")
        probe = next((b for b in program.buffers() if b.is_floating_point()), None)
        if probe is not None and (probe.device != reference.device or probe.dtype != reference.dtype):
            # The weights were moved (model.to(...)) since this program was compiled.
            program.to(device=reference.device, dtype=reference.dtype)
        return program(facts=facts) if facts else program()

    def extra_repr(self) -> str:
        return f"{len(self._initial)} learnable weights, {len(self._programs)} compiled batches"


class SampleLoader:
    """Batches of samples, compiled by ``model``; iterate once per epoch.

    Batch membership is fixed across epochs (each batch is compiled once and cached;
    epochs visit the batches in a new order): see the module NOTE and ``partitions``.

    Args:
        model: the :class:`MiniBatchModel` that compiles (and caches) the batches.
        samples: the sample ids to draw from (e.g. a training split).
        batch_size: samples per batch; None: all of them in one batch (full batch).
        shuffle: shuffle the samples into batches (once per partition, seeded) and
            visit the batches in a new order every epoch; without it batches are
            consecutive runs of ``samples`` in the given order, every epoch alike.
        drop_last: drop each partition's last batch if it is smaller than ``batch_size``.
        seed: the seed of all shuffling: the same seed gives the same batches.
        partitions: how many different partitions epochs cycle through (module NOTE).
        rank, world_size: under data parallelism (:mod:`neurovec.distributed`), every
            batch is cut into ``world_size`` near-equal parts and this loader yields
            part ``rank``; every rank sees the same number of steps.

    ``loader.batches(epoch)`` lists an epoch's batches (sample ids, the whole batch
    even under data parallelism), e.g. to feed the same batches to a PyG loop. Each
    iteration is one epoch; the epoch counter starts at 0 and ``set_epoch`` sets it.
    Iterating compiles the epoch's batches first (a progress bar if that is slow).
    """

    def __init__(self, model: MiniBatchModel, samples, batch_size: int | None = None, shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, partitions: int = 1, rank: int = 0, world_size: int = 1):
        if not isinstance(model, MiniBatchModel):
            raise TypeError(f"SampleLoader needs a MiniBatchModel (got {type(model).__name__})")
        self.model = model
        self.samples = _as_ids(samples)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be positive or None (got {batch_size})")
        if partitions < 1:
            raise ValueError(f"partitions must be positive (got {partitions})")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size (got rank {rank}, world_size {world_size})")
        self.batch_size = self.samples.size if batch_size is None else int(batch_size)
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.partitions = partitions if shuffle else 1
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        if not self.batches(0):
            raise ValueError(f"no batches: {self.samples.size} samples, batch_size {self.batch_size}, drop_last")
        smallest = min(b.size for p in range(self.partitions) for b in self._partition(p))
        if smallest < world_size:
            raise ValueError(f"a batch of {smallest} samples cannot be split across {world_size} ranks: "
                             f"use drop_last=True or a batch size that leaves at least {world_size} per batch")

    def _partition(self, p: int) -> list[np.ndarray]:
        order = self.samples
        if self.shuffle:
            order = self.samples[np.random.default_rng([self.seed, 0, p]).permutation(self.samples.size)]
        cuts = list(range(0, order.size, self.batch_size))
        batches = [order[i:i + self.batch_size] for i in cuts]
        if self.drop_last and batches[-1].size < self.batch_size:
            batches.pop()
        return batches

    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The whole batches of ``epoch`` (default: the next one iterated), in visiting order."""
        epoch = self.epoch if epoch is None else epoch
        batches = self._partition(epoch % self.partitions)
        if self.shuffle:
            batches = [batches[k] for k in np.random.default_rng([self.seed, 1, epoch]).permutation(len(batches))]
        return batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.batches(0))

    def _part(self, batch: np.ndarray) -> np.ndarray:
        return np.array_split(batch, self.world_size)[self.rank] if self.world_size > 1 else batch

    def __iter__(self) -> Iterator[MiniBatch]:
        batches = self.batches(self.epoch)
        self.epoch += 1
        compiled = []
        with Progress("neurovec compile batches", len(batches), "batches", COMPILE_PROGRESS_DELAY_S) as bar:
            for k, batch in enumerate(batches):
                bar.update(k, f"{len(batch)} samples")
                compiled.append(self.model.batch(self._part(batch), global_size=batch.size))
        return iter(compiled)


def _as_ids(samples) -> np.ndarray:
    array = np.asarray(samples)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"samples must be a non-empty 1-D sequence of sample ids (got shape {array.shape})")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"samples must be integer sample ids (got dtype {array.dtype})")
    return np.ascontiguousarray(array, dtype=np.int64)


def _short(samples: np.ndarray) -> str:
    head = ", ".join(map(str, samples[:5].tolist()))
    return f"[{head}{', ...' if samples.size > 5 else ''}] ({samples.size} samples)"
