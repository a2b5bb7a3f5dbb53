"""Running a partitioned graph: each rank's compiled stages, the halo exchange between them.

    rank_module = compile_rank(source, parts, rank, settings="default", dtype=torch.float64)   # no group needed
    model = PartitionedModule(rank_module)          # under torchrun: checks the group, links the ranks
    out = model()                                   # this rank's outputs: rows model.output_ids of the graph's
    loss = mean_loss(per_row_losses)                # mean over all ranks' rows
    loss.backward(); model.all_reduce_gradients(); optimizer.step()

A :class:`RankModule` compiles one rank's stage graphs (``plan.py``), each with
``Settings(dynamic_facts=...)`` naming the earlier layers it reads, and shares one
set of weights among them. Its forward runs stage after stage; after each stage
it *exchanges* the layers others read: it sends the rows in its send lists and
receives its halo rows, which the next stages read after its own rows.

The exchange (:class:`_Exchange`) is one ``all_to_all_single`` per exchanged
layer (gloo on CPU, nccl on CUDA) with the per-peer row counts fixed at compile
time; its backward is the reverse ``all_to_all`` of the halo rows' gradients, and
autograd's ``index_select`` backward sums them into the owners' rows (a row sent
to several ranks gets all their gradients). Collectives must run in the same
order on every rank, also in backward, where autograd may order independent
nodes differently on different ranks: each exchange therefore also takes and
returns a scalar *token*, chaining the exchanges so that the backward runs them
exactly in reverse, and the outputs carry the last token so every rank runs
every backward exchange even where its own loss does not read a halo.

Weights are replicated: every rank builds the same initial values (seeded),
rank 0's are broadcast at the start, and :meth:`PartitionedModule.all_reduce_gradients`
*sums* the gradients over ranks. With :func:`mean_loss` (each rank's sum over its
rows divided by the number of rows on all ranks) the summed gradient is exactly
the gradient of the mean over the whole graph, and training equals one process's.

:func:`simulate` runs all ranks' modules in one process, exchanging by indexing
(autograd crosses ranks directly): the tests and the benchmark's byte counts use it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..compiling import compile as compile_graph
from ..compiler.pipeline import resolve_settings
from ..compiler.settings import Settings
from ..engines.torch_module import input_facts
from ..engines.weights import WeightStore
from .partitioner import PartitionError
from .plan import Exchange, RankPlan, Source, plan_rank

__all__ = ["RankModule", "PartitionedModule", "ExchangeCounter", "compile_rank", "mean_loss", "simulate"]

logger = logging.getLogger(__name__)


@dataclass
class ExchangeCounter:
    """Values and bytes this rank sent, forward and backward, since the last :meth:`reset`."""

    forward_values: int = 0
    backward_values: int = 0
    forward_bytes: int = 0
    backward_bytes: int = 0
    calls: int = 0

    def reset(self) -> None:
        self.forward_values = self.backward_values = self.forward_bytes = self.backward_bytes = self.calls = 0


@dataclass(frozen=True, eq=False)
class _UnitSpec:
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[int, int], ...]


@dataclass(eq=False)
class _Tables:
    """What a rank module keeps of its plan (the stage graphs are let go after compiling)."""

    rank: int
    world_size: int
    digest: str
    names: tuple
    shapes: tuple
    stage_units: list[list[int]]
    units: list[_UnitSpec]
    exchanges: list[list[Exchange]]
    kept_rows: dict[int, int]
    output_ids: np.ndarray
    output_shape: tuple
    output_layers: list[int] = field(default_factory=list)


def compile_rank(source: Source, parts, rank: int, world_size: int | None = None,
                 settings: Settings | str | dict | None = None, dtype: torch.dtype | None = None,
                 weights: WeightStore | None = None) -> "RankModule":
    """Plan and compile rank ``rank``'s programs (no process group needed: this is the compile step)."""
    start = time.perf_counter()
    plan = plan_rank(source, parts, rank, world_size)
    planned = time.perf_counter() - start
    module = RankModule(plan, settings, dtype, weights)
    module.timings["plan"] = planned + module.timings.pop("build")  # the unit graphs are built while compiling
    return module


class RankModule(nn.Module):
    """One rank's compiled stages (module doc). ``weights``: share another module's weights
    (:func:`simulate` runs several ranks in one process on one set)."""

    def __init__(self, plan: RankPlan, settings: Settings | str | dict | None = None,
                 dtype: torch.dtype | None = None, weights: WeightStore | None = None):
        super().__init__()
        settings = resolve_settings(settings)
        learnable = [w for w in plan.weights if w.learnable]
        self.weights = weights if weights is not None else WeightStore(learnable, dtype)
        reference = next(iter(self.weights.parameters()), None)
        dtype = reference.dtype if reference is not None else (dtype or torch.get_default_dtype())
        self.register_buffer("_probe", torch.zeros((), dtype=dtype), persistent=False)  # dtype and device
        self.units = nn.ModuleList()
        self.timings = {"build": 0.0, "compile": 0.0}
        specs, stage_units = [], []
        for stage in plan.stages:
            stage_units.append([])
            for unit in stage:
                dynamic = tuple(dict.fromkeys(settings.dynamic_facts + tuple(name for name, _ in unit.inputs)))
                start = time.perf_counter()
                graph = unit.graph
                self.timings["build"] += time.perf_counter() - start
                start = time.perf_counter()
                module = compile_graph(graph, settings.model_copy(update={"dynamic_facts": dynamic}), dtype)
                self.timings["compile"] += time.perf_counter() - start
                del graph
                unit.release()  # its rows too: the rank holds one unit's arrays at a time
                _share(module, self.weights)
                _drop_placeholders(module, {name for name, _ in unit.inputs})
                stage_units[-1].append(len(self.units))
                self.units.append(module)
                specs.append(_UnitSpec(unit.inputs, unit.outputs))
        self.tables = _Tables(plan.rank, plan.world_size, plan.digest, plan.names, plan.shapes, stage_units, specs,
                              [list(x) for x in plan.exchanges], {k: int(v.size) for k, v in plan.kept.items()},
                              plan.output_ids, tuple(plan.output_shape))
        # Outputs: rows of the kept values of each output layer, then into graph output order.
        order, positions = [], []
        for layer in np.unique(plan.output_layers).tolist():
            where = np.flatnonzero(plan.output_layers == layer)
            self.tables.output_layers.append(layer)
            positions.append(torch.from_numpy(plan.output_positions[where]))
            order.append(where)
        self._out_positions = positions
        order = np.concatenate(order) if order else np.zeros(0, np.int64)
        self._out_order = None if np.array_equal(order, np.arange(order.size)) else torch.from_numpy(np.argsort(order))
        self._send_rows = {x.layer: torch.from_numpy(x.send_rows.astype(np.int64))
                           for stage in plan.exchanges for x in stage}
        # The last stage that reads each layer's values (its own stage for an exchanged one: the exchange
        # after it reads them); outputs are read at the end. After that stage the forward drops them, so
        # that only what autograd saved stays alive.
        last: dict[int, int] = {}
        for index, stage in enumerate(stage_units):
            for k in stage:
                for _, layer in specs[k].inputs:
                    last[layer] = index
        for index, stage in enumerate(plan.exchanges):
            for x in stage:
                last[x.layer] = max(last.get(x.layer, index), index + 1) if x.layer in last else index + 1
        self._done_after: dict[int, list[int]] = {}
        outputs = set(np.unique(plan.output_layers).tolist())
        for layer, index in last.items():
            if layer not in outputs and index < len(stage_units):
                self._done_after.setdefault(index, []).append(layer)

    # -- facts about the plan ------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.tables.rank

    @property
    def world_size(self) -> int:
        return self.tables.world_size

    @property
    def output_ids(self) -> np.ndarray:
        """Positions in the graph's output list of the rows :meth:`forward` returns (ascending)."""
        return self.tables.output_ids

    @property
    def exchanges(self) -> list[Exchange]:
        return [x for stage in self.tables.exchanges for x in stage]

    def exchanged_values(self) -> tuple[int, int]:
        """Values (rows x row size) this rank sends and receives per forward, over all exchanged layers;
        the backward sends the received count back."""
        sent = sum(int(np.sum(x.send_counts)) * x.row_size for x in self.exchanges)
        received = sum(int(x.recv_rows.size) * x.row_size for x in self.exchanges)
        return sent, received

    # -- running ----------------------------------------------------------------------------------

    def _like(self) -> torch.Tensor:
        return self._probe

    def steps(self):
        """The forward as a generator: yields ``(exchange, rows to send)`` after each stage and
        receives the halo rows; yields ``(None, outputs)`` last. Drivers: :meth:`PartitionedModule.forward`
        (torch.distributed) and :func:`simulate` (one process)."""
        like = self._like()
        t = self.tables
        values: dict[int, torch.Tensor] = {}
        halos: dict[int, torch.Tensor] = {}

        def rows_of(layer: int) -> torch.Tensor:
            if layer not in values:  # this rank keeps no row of it
                values[layer] = like.new_zeros((0,) + tuple(t.shapes[layer]))
            return values[layer]

        for index, (stage, exchanges) in enumerate(zip(t.stage_units, t.exchanges)):
            for k in stage:
                spec = t.units[k]
                facts = {}
                for name, layer in spec.inputs:
                    own = rows_of(layer)
                    facts[name] = torch.cat([own, halos[layer]]) if layer in halos else own
                out = self.units[k](facts=facts)
                del facts
                if len(spec.outputs) == 1:
                    values[spec.outputs[0][0]] = out
                else:
                    for (layer, _), part in zip(spec.outputs, out.split([n for _, n in spec.outputs])):
                        values[layer] = part
            for layer in self._done_after.get(index, ()):  # no later stage reads them: let them go
                values.pop(layer, None)
                halos.pop(layer, None)
            for x in exchanges:
                send = rows_of(x.layer).index_select(0, self._send_rows[x.layer].to(like.device))
                halos[x.layer] = yield x, send
                del send
        parts = [rows_of(layer).index_select(0, pos.to(like.device))
                 for layer, pos in zip(t.output_layers, self._out_positions)]
        if not parts:
            out = like.new_zeros((0,) + t.output_shape)
        else:
            out = torch.cat(parts) if len(parts) > 1 else parts[0]
        if self._out_order is not None:
            out = out.index_select(0, self._out_order.to(like.device))
        yield None, out

    def forward(self) -> torch.Tensor:
        """This rank's outputs with no other rank: only where nothing is exchanged (one rank)."""
        steps = self.steps()
        exchange, value = next(steps)
        if exchange is not None:
            raise RuntimeError(f"rank {self.rank} of {self.world_size} exchanges layer {exchange.name!r} with other "
                               "ranks: run it under torch.distributed with PartitionedModule(rank_module), or all "
                               "ranks in one process with partition.simulate([...])")
        return value

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for module in self.units:  # moving re-creates constants from the program: drop the placeholders again
            _drop_placeholders(module, {name for spec in self.tables.units for name, _ in spec.inputs})
        return self

    def extra_repr(self) -> str:
        sent, received = self.exchanged_values()
        return (f"rank {self.rank} of {self.world_size}, {len(self.tables.stage_units)} stages, {len(self.units)} "
                f"programs, {self.output_ids.size} outputs, {len(self.exchanges)} exchanged layers "
                f"({sent} values sent, {received} received per forward)")


def _share(module: nn.Module, weights: WeightStore) -> None:
    """Make a compiled program read ``weights``' parameters instead of its own copies."""
    ours = dict(weights.named_parameters())
    owners = dict(module.weights.named_modules())
    for name, _ in list(module.weights.named_parameters()):
        path, _, leaf = name.rpartition(".")
        setattr(owners[path], leaf, ours[name])


def _drop_placeholders(module: nn.Module, names: set[str]) -> None:
    """Replace the stored values of the dynamic inputs (zeros, never read: every call passes them) by one
    zero broadcast to their shape, so that they take no memory."""
    for node in input_facts(module.program):
        if node.attrs["fact_layer"] in names:
            const = node.attrs["const"]
            current = getattr(module, const)
            setattr(module, const, current.new_zeros(()).expand(current.shape))


class _Exchange(torch.autograd.Function):
    """all_to_all of rows with fixed per-peer counts; backward: the reverse all_to_all (module doc)."""

    @staticmethod
    def forward(ctx, send: torch.Tensor, token: torch.Tensor, exchange: Exchange, group, counter: ExchangeCounter):
        ctx.exchange, ctx.group, ctx.counter = exchange, group, counter
        received = send.new_empty((int(sum(exchange.recv_counts)),) + tuple(send.shape[1:]))
        dist.all_to_all_single(received, send.contiguous(), list(exchange.recv_counts), list(exchange.send_counts),
                               group=group)
        counter.forward_values += send.numel()
        counter.forward_bytes += send.numel() * send.element_size()
        counter.calls += 1
        return received, token.new_zeros(())

    @staticmethod
    def backward(ctx, grad_received: torch.Tensor, grad_token: torch.Tensor):
        if torch.is_grad_enabled():
            raise RuntimeError("the halo exchange of a partitioned module has no double backward: call backward "
                               "without create_graph=True")
        x = ctx.exchange
        grad_send = grad_received.new_empty((int(sum(x.send_counts)),) + tuple(grad_received.shape[1:]))
        dist.all_to_all_single(grad_send, grad_received.contiguous(), list(x.send_counts), list(x.recv_counts),
                               group=ctx.group)
        ctx.counter.backward_values += grad_received.numel()
        ctx.counter.backward_bytes += grad_received.numel() * grad_received.element_size()
        ctx.counter.calls += 1
        return grad_send, grad_token.new_zeros(()), None, None, None


class _Attach(torch.autograd.Function):
    """``out`` unchanged, made to depend on ``token``: backward reaches every exchange on every rank."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, token: torch.Tensor):
        return out.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad.new_zeros(())


class PartitionedModule(nn.Module):
    """A :class:`RankModule` run under torch.distributed: the exchanges are collectives.

    Checks at construction that the process group has the rank count and this
    process the rank that ``rank_module`` was compiled for, and that every rank
    compiled for the same partition (one ``all_gather`` of the plans' fingerprints);
    then broadcasts rank 0's weights. ``group`` defaults to the whole world.
    """

    def __init__(self, rank_module: RankModule, group=None, broadcast: bool = True):
        super().__init__()
        if not isinstance(rank_module, RankModule):
            raise TypeError(f"PartitionedModule wraps a RankModule (got {type(rank_module).__name__}); "
                            "make one with partition.compile_rank(...)")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("PartitionedModule needs a torch.distributed process group: launch with torchrun and "
                               "call neurovec.distributed.init() first")
        self.rank_module = rank_module
        self.group = group
        self.counter = ExchangeCounter()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        t = rank_module.tables
        if world != t.world_size:
            raise PartitionError(f"world size: this module was compiled for {t.world_size} ranks, but the process "
                                 f"group has {world}; launch with --nproc_per_node {t.world_size} (times nodes) or "
                                 f"compile for {world} ranks")
        if rank != t.rank:
            raise PartitionError(f"rank: this module was compiled for rank {t.rank}, but this process is rank {rank}")
        mine = torch.tensor([int(t.digest, 16) & (2**62 - 1), len(t.stage_units), len(rank_module.exchanges)],
                            dtype=torch.int64, device=self._device())
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        different = [r for r, other in enumerate(every) if not torch.equal(other, mine)]
        if different:
            raise PartitionError(f"rank {rank}: ranks {different} compiled for another partition or graph (plan "
                                 "fingerprints differ); compile every rank from the same parts and source")
        if broadcast:
            with torch.no_grad():
                for p in rank_module.weights.parameters():
                    dist.broadcast(p, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)

    def _device(self) -> torch.device:
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def output_ids(self) -> np.ndarray:
        return self.rank_module.output_ids

    @property
    def weights(self) -> WeightStore:
        return self.rank_module.weights

    def forward(self) -> torch.Tensor:
        like = self.rank_module._like()
        token = like.new_zeros((), requires_grad=torch.is_grad_enabled())
        steps = self.rank_module.steps()
        exchange, value = next(steps)
        while exchange is not None:
            if token.requires_grad:
                halo, token = _Exchange.apply(value, token, exchange, self.group, self.counter)
            else:
                halo, _ = _Exchange.apply(value, token, exchange, self.group, self.counter)
            exchange, value = steps.send(halo)
        return _Attach.apply(value, token) if token.requires_grad else value

    def all_reduce_gradients(self) -> None:
        """Sum every weight's gradient over the ranks (one all_reduce of all of them, flattened)."""
        params = list(self.rank_module.weights.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for p in params:
            n = p.numel()
            if p.grad is None:
                p.grad = flat[offset:offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset:offset + n].view_as(p))
            offset += n


def mean_loss(per_row: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's share of the mean of ``per_row`` over every rank's rows.

    ``per_row``: one loss per row this rank holds (e.g. ``reduction="none"`` over its
    labelled outputs; any trailing shape is averaged too). Returns ``sum / total
    count on all ranks`` (one all_reduce of the count); the gradients, *summed* over
    ranks by :meth:`PartitionedModule.all_reduce_gradients`, are then the gradient
    of the global mean. Without a process group it is the plain mean.
    """
    count = torch.tensor([per_row.numel()], dtype=torch.int64, device=per_row.device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, group=group)
    if int(count) == 0:
        raise ValueError("mean_loss: no rows on any rank")
    return per_row.sum() / int(count)


def simulate(rank_modules: list[RankModule]) -> list[torch.Tensor]:
    """Run every rank's module in this process, in lockstep, exchanging by indexing.

    Returns each rank's outputs; autograd crosses ranks directly (a halo row is a
    slice of its owner's values), so ``sum(losses).backward()`` gives every rank's
    gradients. Give the modules one set of weights (``compile_rank(..., weights=...)``)
    to train them as one model.
    """
    world = len(rank_modules)
    for r, m in enumerate(rank_modules):
        if m.rank != r or m.world_size != world:
            raise PartitionError(f"simulate: module {r} was compiled as rank {m.rank} of {m.world_size}; pass all "
                                 f"{m.world_size} ranks' modules in rank order")
    steps = [m.steps() for m in rank_modules]
    items = [next(s) for s in steps]
    while items[0][0] is not None:
        exchanges = [x for x, _ in items]
        if any(x is None or x.layer != exchanges[0].layer for x in exchanges):
            raise PartitionError("simulate: the ranks exchange different layers (compiled from different plans)")
        chunks = [list(send.split(list(x.send_counts))) for x, send in items]
        received = []
        for r, x in enumerate(exchanges):
            for p in range(world):
                if chunks[p][r].shape[0] != x.recv_counts[p]:
                    raise PartitionError(f"simulate: rank {p} sends {chunks[p][r].shape[0]} rows of {x.name!r} to "
                                         f"rank {r}, which expects {x.recv_counts[p]}")
            received.append(torch.cat([chunks[p][r] for p in range(world)]))
        items = [s.send(h) for s, h in zip(steps, received)]
    return [value for _, value in items]
