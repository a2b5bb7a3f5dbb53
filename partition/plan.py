"""Splitting one neuron graph across ranks: every rank's own programs and its exchange lists.

A *partition* gives every neuron of every :class:`~neurovec.NeuronLayer` an owner
rank (for node-level GNNs: all neurons of graph node ``i`` go where node ``i``
goes, so each aggregation's group-by key is the owner and the reduction stays
local). Fact layers are constants: every rank keeps the rows its neurons read, and
they are never exchanged.

Rank ``r`` computes only the neurons it owns. An edge of one of them that reads a
neuron owned elsewhere reads a *halo* row, received from its owner before the
layer runs. The layers are cut into *stages*: a layer goes one stage after every
layer it reads through a halo on any rank (and in the stage of the layers it
reads only locally), so within a stage every read is local::

    stage(L) = max over layers S that L reads of  stage(S) + (1 if some edge of L reads S across ranks)

After stage ``t``, every layer of stage ``t`` that some rank reads across ranks is
*exchanged*: each rank sends its owners' rows that others read and receives its
halo (one ``all_to_all`` per layer). A later stage reads layer ``S`` as the rows
``[owned rows of S, halo rows of S]``.

Each stage of a rank is an ordinary neuron graph, compiled by ``neurovec.compile``
with the earlier layers it reads as *dynamic fact layers*
(``Settings(dynamic_facts=...)``), so every optimizer pass keeps its meaning: no
pass sees across the boundary, none folds what another rank computes, and every
row another rank receives is an output of its stage. The send and receive lists
are plain arrays made once here, in bulk:

* receive list of ``S`` on rank ``r``: the distinct rows of ``S`` that ``r``'s
  neurons read and ``r`` does not own, ordered by owner, then by row;
* send list of ``S`` from ``r`` to ``p``: the rows of ``S`` owned by ``r`` that
  ``p``'s neurons read, ordered by row - exactly ``p``'s receive list from ``r``.

A :class:`RankPlan` holds one rank's stage graphs and lists; ``runtime.py`` runs
them. A plan is made from a :class:`GraphSource` (a whole :class:`~neurovec.Graph`,
any template) or from a source that builds only the rows a rank owns (``gnn.py``,
for graphs too large to build whole).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..sources.graph import FactLayer, Graph, GraphError, NeuronLayer, Weight
from .partitioner import PartitionError, check_parts, sorted_unique

__all__ = ["Rows", "Source", "GraphSource", "Exchange", "Unit", "RankPlan", "plan_rank", "stages_of",
           "parts_digest"]


@dataclass(frozen=True, eq=False)
class Rows:
    """Some neurons of one layer with their edges, inputs still in global numbering.

    ``rows`` are the neurons' ordinals in their layer (ascending); ``counts``,
    ``input_layer``, ``input_ordinal``, ``input_weight`` and ``bias`` are the
    :class:`~neurovec.NeuronLayer` fields of those neurons, in the same order.
    """

    rows: np.ndarray
    counts: np.ndarray
    input_layer: np.ndarray
    input_ordinal: np.ndarray
    input_weight: np.ndarray
    bias: np.ndarray


class Source(Protocol):
    """What a plan needs of a graph; :class:`GraphSource` implements it for a built graph.

    Every rank calls these with the same ``owners``; each answer is whole arrays.
    """

    names: tuple[str, ...]          # every layer, in topological order
    shapes: tuple[tuple, ...]       # each layer's value shape
    sizes: tuple[int, ...]          # each layer's neuron count
    facts: tuple[bool, ...]         # which layers are fact layers
    weights: tuple[Weight, ...]
    output_layer: np.ndarray
    output_ordinal: np.ndarray

    def layer_info(self, index: int) -> dict: ...           # facts: unit; neurons: aggregation, transformation
    def layer_reads(self): ...                               # yields (L, S): layer L reads layer S
    def owners(self, parts: np.ndarray, world_size: int) -> dict[int, np.ndarray]: ...
    def rows(self, index: int, rows: np.ndarray) -> Rows: ...
    def fact_rows(self, index: int, rows: np.ndarray) -> np.ndarray: ...
    def crossing(self, owners: dict[int, np.ndarray]) -> set[tuple[int, int]]: ...
    def sent(self, layer: int, owners: dict[int, np.ndarray], rank: int) -> tuple[np.ndarray, np.ndarray]: ...


def present(values: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of ``values`` (all in ``0..size-1``), ascending: one pass with a mask, no sort."""
    mask = np.zeros(size, bool)
    mask[values] = True
    return np.flatnonzero(mask)


def select_edges(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The edge ids of ``rows`` of a CSR layer, row after row (whole arrays)."""
    counts = ptr[rows + 1] - ptr[rows]
    return np.repeat(ptr[rows] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))


class GraphSource:
    """A built :class:`~neurovec.Graph` as a plan's source (any template, any neuron graph).

    Owners (``owners``): a neuron layer with as many neurons as ``parts`` has nodes
    takes ``parts`` itself (neuron ``i`` goes to ``parts[i]``); ``layer_owners``
    (layer name -> one rank per neuron) sets any layer explicitly; every other
    neuron goes where its first input's neuron goes (a readout neuron follows its
    first node), or, where that input is a fact, to contiguous blocks.
    """

    def __init__(self, graph: Graph, layer_owners: dict[str, np.ndarray] | None = None):
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphSource expects a neurovec.Graph (got {type(graph).__name__})")
        self.graph = graph
        self.names = tuple(layer.name for layer in graph.layers)
        self.shapes = tuple(graph.layer_shapes)
        self.sizes = tuple(layer.size for layer in graph.layers)
        self.facts = tuple(isinstance(layer, FactLayer) for layer in graph.layers)
        self.weights = tuple(graph.weights)
        self.output_layer, self.output_ordinal = graph.output_layer, graph.output_ordinal
        self._layer_owners = dict(layer_owners or {})
        unknown = set(self._layer_owners) - set(self.names)
        if unknown:
            raise PartitionError(f"layer_owners: the graph has no layer named {sorted(unknown)[0]!r}")

    def layer_info(self, index: int) -> dict:
        layer = self.graph.layers[index]
        if isinstance(layer, FactLayer):
            return {"unit": layer.unit}
        return {"aggregation": layer.aggregation, "transformation": layer.transformation}

    def owners(self, parts: np.ndarray, world_size: int) -> dict[int, np.ndarray]:
        owners: dict[int, np.ndarray] = {}
        for index, layer in enumerate(self.graph.layers):
            if isinstance(layer, FactLayer):
                continue
            if layer.name in self._layer_owners:
                owners[index] = _ranks(self._layer_owners[layer.name], layer.size, world_size, layer.name)
            elif layer.size == parts.size:
                owners[index] = parts
            else:  # the owner of the first input, or contiguous blocks where that is a fact
                first = layer.ptr[:-1]
                src, ordinal = layer.input_layer[first], layer.input_ordinal[first]
                owner = (np.arange(layer.size, dtype=np.int64) * world_size) // layer.size
                for s in np.unique(src).tolist():
                    if s in owners:
                        mask = src == s
                        owner[mask] = owners[s][ordinal[mask]]
                owners[index] = owner
        return owners

    def layer_reads(self):
        """(L, S) for every neuron layer L and every layer S that L reads."""
        for index, layer in enumerate(self.graph.layers):
            if isinstance(layer, NeuronLayer):
                for s in present(layer.input_layer, len(self.names)).tolist():
                    yield index, s

    def rows(self, index: int, rows: np.ndarray) -> Rows:
        layer = self.graph.layers[index]
        edges = select_edges(layer.ptr, rows)
        return Rows(rows, layer.counts[rows], layer.input_layer[edges], layer.input_ordinal[edges],
                    layer.input_weight[edges], layer.bias[rows])

    def fact_rows(self, index: int, rows: np.ndarray) -> np.ndarray:
        return self.graph.layers[index].values[rows]

    def _edges_reading(self, owners: dict[int, np.ndarray]):
        """Per neuron layer L and neuron layer S it reads: (reader owner, ordinal of S) of those edges."""
        for index, layer in enumerate(self.graph.layers):
            if index not in owners:
                continue
            reader = np.repeat(owners[index], layer.counts)
            for s in present(layer.input_layer, len(self.names)).tolist():
                if s in owners:
                    mask = layer.input_layer == s
                    yield index, s, reader[mask], layer.input_ordinal[mask]

    def crossing(self, owners: dict[int, np.ndarray]) -> set[tuple[int, int]]:
        return {(index, s) for index, s, reader, ordinal in self._edges_reading(owners)
                if np.any(owners[s][ordinal] != reader)}

    def sent(self, layer: int, owners: dict[int, np.ndarray], rank: int) -> tuple[np.ndarray, np.ndarray]:
        size = np.int64(self.sizes[layer])
        keys = []  # reader rank * size + row, for rows of `layer` owned here and read by another rank
        for _, s, reader, ordinal in self._edges_reading(owners):
            if s == layer:
                mask = (owners[s][ordinal] == rank) & (reader != rank)
                keys.append(reader[mask] * size + ordinal[mask])
        keys = sorted_unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
        return keys // size, keys % size


def _ranks(values, size: int, world_size: int, name: str) -> np.ndarray:
    values = np.asarray(values)
    if values.shape != (size,) or values.dtype.kind not in "iu":
        raise PartitionError(f"layer_owners[{name!r}]: expected {size} integer ranks (got shape {values.shape}, "
                             f"{values.dtype})")
    values = values.astype(np.int64)
    if values.size and (values.min() < 0 or values.max() >= world_size):
        raise PartitionError(f"layer_owners[{name!r}]: ranks must lie in 0..{world_size - 1}")
    return values


def stages_of(source: Source, crossing: set[tuple[int, int]]) -> list[int]:
    """The stage of every layer (facts: -1), from the layer-level reads and ``crossing``.

    ``crossing`` holds the pairs ``(L, S)``: some edge of ``L`` reads a neuron of ``S``
    owned by another rank than its reader's.
    """
    reads: dict[int, set[int]] = {}
    for index, s in source.layer_reads():
        reads.setdefault(index, set()).add(s)
    stage = [-1] * len(source.names)
    for index in range(len(source.names)):
        if source.facts[index]:
            continue
        stage[index] = max([stage[s] + ((index, s) in crossing) for s in reads.get(index, ()) if not source.facts[s]],
                           default=0)
    return stage


@dataclass(frozen=True, eq=False)
class Exchange:
    """One exchanged layer on one rank: what it sends and receives after the layer's stage.

    ``send_rows`` index this rank's owned rows of the layer (peer after peer, each
    peer's in ascending row order), ``send_counts[p]`` of them for rank ``p``;
    ``recv_rows`` are the global ordinals of the halo rows received, ``recv_counts[p]``
    from rank ``p``, in the same order as ``p`` sends them.
    """

    layer: int
    name: str
    shape: tuple
    send_rows: np.ndarray
    send_counts: tuple[int, ...]
    recv_rows: np.ndarray
    recv_counts: tuple[int, ...]

    @property
    def row_size(self) -> int:
        """Values per row (the product of the value shape)."""
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Unit:
    """One compiled program of a stage: its graph, its dynamic inputs, and which rows it returns.

    ``inputs``: (fact layer name in ``graph``, global layer index) for each layer of an
    earlier stage it reads. ``outputs``: (global layer index, number of rows), in the
    order the program returns their rows. ``graph`` is built when read (each time), from
    the rows the plan keeps for it; :meth:`release` lets those go (a rank compiles its
    units one at a time and releases each, so that it never holds every stage's arrays).
    """

    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[int, int], ...]
    _build: list = field(repr=False, default_factory=list)  # [callable] until released

    @property
    def graph(self) -> Graph:
        if not self._build:
            raise RuntimeError("this unit was released (compiled): its graph is no longer held")
        return self._build[0]()

    def release(self) -> None:
        self._build.clear()


@dataclass(frozen=True, eq=False)
class RankPlan:
    """Everything rank ``rank`` of ``world_size`` builds and runs (module doc).

    ``stages[t]``: the units of stage ``t`` (possibly none on this rank);
    ``exchanges[t]``: the layers exchanged after stage ``t``, the same layers on
    every rank. ``kept[S]``: the rows of layer ``S`` this rank keeps after its stage
    (global ordinals, ascending): all its owned rows where a later stage reads ``S``,
    else the owned rows that are graph outputs. ``output_ids``: the graph outputs
    this rank owns (positions in the graph's output list, ascending);
    ``output_from[k]`` = (layer, position in ``kept[layer]``) of each.
    """

    rank: int
    world_size: int
    digest: str
    names: tuple[str, ...]
    shapes: tuple[tuple, ...]
    weights: tuple[Weight, ...]
    stages: tuple[tuple[Unit, ...], ...]
    exchanges: tuple[tuple[Exchange, ...], ...]
    kept: dict[int, np.ndarray]
    output_ids: np.ndarray
    output_layers: np.ndarray
    output_positions: np.ndarray
    output_shape: tuple
    stage_of: tuple[int, ...] = field(default=())

    @property
    def halo_rows(self) -> dict[str, int]:
        """Rows received per exchanged layer."""
        return {x.name: int(x.recv_rows.size) for stage in self.exchanges for x in stage}

    def exchanged_values(self) -> tuple[int, int]:
        """(values this rank sends, values it receives) per forward: rows x values per row, summed
        over the exchanged layers; the backward moves the same counts the other way."""
        sent = sum(int(np.sum(x.send_counts)) * x.row_size for stage in self.exchanges for x in stage)
        received = sum(int(x.recv_rows.size) * x.row_size for stage in self.exchanges for x in stage)
        return sent, received


def parts_digest(parts: np.ndarray, world_size: int) -> str:
    """A short fingerprint of a partition (ranks compare theirs before the first exchange)."""
    h = hashlib.blake2b(np.ascontiguousarray(parts, dtype=np.int64).tobytes(), digest_size=8)
    h.update(str(world_size).encode())
    return h.hexdigest()


def plan_rank(source: Source | Graph, parts, rank: int, world_size: int | None = None) -> RankPlan:
    """The plan of rank ``rank``: its stage graphs and exchange lists (module doc).

    ``parts`` gives one rank per node (``partition_nodes``); ``world_size`` defaults
    to ``max(parts) + 1`` and every rank must own at least one node.
    """
    if isinstance(source, Graph):
        source = GraphSource(source)
    parts = np.asarray(parts)
    n_nodes = _node_count(source, parts)
    if world_size is not None and world_size > n_nodes:
        raise PartitionError(f"world_size: {world_size} ranks for a graph of {n_nodes} nodes; every rank must own "
                             f"at least one node, so use at most {n_nodes} ranks")
    parts = check_parts(parts, n_nodes, world_size)
    world_size = int(parts.max()) + 1 if world_size is None else int(world_size)
    if not 0 <= rank < world_size:
        raise PartitionError(f"rank: {rank} is outside 0..{world_size - 1} ({world_size} ranks)")
    for k in np.unique(source.output_layer).tolist():
        if source.facts[k]:
            raise GraphError(f"output layer {source.names[k]!r} is a fact layer: a partitioned graph's outputs "
                             "must be computed neurons")
    owners = source.owners(parts, world_size)
    crossing = source.crossing(owners)
    stage = stages_of(source, crossing)
    exchanged = sorted({s for _, s in crossing})
    n_stages = max(stage) + 1
    reads = {}
    for index, s in source.layer_reads():
        reads.setdefault(s, set()).add(index)
    read_later = {s for s, readers in reads.items() if not source.facts[s] and
                  any(stage[r] > stage[s] for r in readers)}

    owned = {index: np.flatnonzero(owner == rank) for index, owner in owners.items()}
    local = {index: source.rows(index, rows) for index, rows in owned.items() if rows.size}

    # Graph outputs owned here, and the rows each layer keeps after its stage.
    out_owner = np.zeros(source.output_layer.size, np.int64)
    for k in np.unique(source.output_layer).tolist():
        mask = source.output_layer == k
        out_owner[mask] = owners[k][source.output_ordinal[mask]]
    output_ids = np.flatnonzero(out_owner == rank)
    output_layers, output_ordinals = source.output_layer[output_ids], source.output_ordinal[output_ids]
    kept: dict[int, np.ndarray] = {}
    for index in owners:
        if index in read_later:
            kept[index] = owned[index]
        elif np.any(output_layers == index):
            kept[index] = sorted_unique(output_ordinals[output_layers == index])
    output_positions = np.zeros(output_ids.size, np.int64)
    for k in np.unique(output_layers).tolist():
        mask = output_layers == k
        output_positions[mask] = np.searchsorted(kept[k], output_ordinals[mask])

    exchanges = [[] for _ in range(n_stages)]
    for s in exchanged:
        exchanges[stage[s]].append(_exchange(source, s, owners, owned, local, rank, world_size))
    halo = {x.layer: x.recv_rows for stage_x in exchanges for x in stage_x}

    units = [_stage_units(source, t, stage, local, owned, halo, kept) for t in range(n_stages)]
    del local  # each stage's units hold their own rows from here on
    return RankPlan(rank, world_size, parts_digest(parts, world_size), source.names, source.shapes,
                    source.weights, tuple(map(tuple, units)), tuple(map(tuple, exchanges)), kept, output_ids,
                    output_layers, output_positions, tuple(source.shapes[int(source.output_layer[0])]),
                    tuple(stage))


def _node_count(source: Source, parts: np.ndarray) -> int:
    n_nodes = getattr(source, "n_nodes", None)
    if n_nodes is not None:
        return int(n_nodes)
    sizes = {source.sizes[i] for i in range(len(source.names)) if not source.facts[i]}
    if parts.ndim == 1 and parts.shape[0] in sizes:
        return int(parts.shape[0])
    raise PartitionError(f"parts: expected one rank per node, i.e. as many values as the node layers have neurons "
                         f"({', '.join(map(str, sorted(sizes)))} in this graph's neuron layers), got an array of "
                         f"shape {parts.shape}")


def _exchange(source, s, owners, owned, local, rank, world_size) -> Exchange:
    # Receive: distinct remote rows of s read by this rank's neurons, by owner then row.
    remote = [rows.input_ordinal[rows.input_layer == s] for rows in local.values()]
    remote = present(np.concatenate(remote), source.sizes[s]) if remote else np.zeros(0, np.int64)
    remote = remote[owners[s][remote] != rank]
    recv_owner = owners[s][remote]
    order = np.argsort(recv_owner, kind="stable")  # rows stay ascending within each owner
    recv_rows = remote[order]
    recv_counts = np.bincount(recv_owner, minlength=world_size)
    # Send: rows of s owned here that other ranks' neurons read, by peer then row.
    peers, rows = source.sent(s, owners, rank)
    send_counts = np.bincount(peers, minlength=world_size)
    return Exchange(s, source.names[s], source.shapes[s], np.searchsorted(owned[s], rows), tuple(send_counts.tolist()),
                    recv_rows, tuple(recv_counts.tolist()))


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each of ``wanted`` stands in ``ids`` (all distinct, non-negative; every wanted id present).

    A table over the ids' range, filled once and read per wanted id: a binary search per
    edge (``searchsorted``) misses the cache on every step at millions of edges.
    """
    if ids.size == 0:
        return np.zeros(0, np.int64)
    table = np.empty(int(ids.max()) + 1, np.int32 if ids.size < 2**31 else np.int64)
    table[ids] = np.arange(ids.size, dtype=table.dtype)
    return table[wanted].astype(np.int64)


def _stage_units(source, t, stage, local, owned, halo, kept) -> list[Unit]:
    """Stage ``t``'s programs on this rank: one per value shape of the rows it keeps, built when read."""
    members = [index for index in range(len(source.names)) if stage[index] == t and index in local]
    if not members:
        return []
    mine = {index: local[index] for index in members}  # the units of this stage share these rows
    inputs = sorted({s for index in members for s in present(mine[index].input_layer, len(source.names)).tolist()
                     if not source.facts[s] and stage[s] < t})
    dynamic = tuple((source.names[s], s) for s in inputs)
    kept_here = [index for index in members if index in kept and kept[index].size]
    units = []
    for shape in dict.fromkeys(source.shapes[i] for i in kept_here):
        outputs = [i for i in kept_here if source.shapes[i] == shape]
        build = functools.partial(_unit_graph, source, members, outputs, inputs, mine, owned, halo, kept)
        units.append(Unit(dynamic, tuple((i, int(kept[i].size)) for i in outputs), [build]))
    return units


def _unit_graph(source, members, outputs, inputs, local, owned, halo, kept) -> Graph:
    """The neuron graph of a stage's ``members`` (owned rows, local numbering) returning ``outputs``."""
    # Which rows of each fact layer the members read.
    fact_rows: dict[int, list[np.ndarray]] = {}
    for index in members:
        rows = local[index]
        for s in present(rows.input_layer, len(source.names)).tolist():
            if source.facts[s]:
                fact_rows.setdefault(s, []).append(rows.input_ordinal[rows.input_layer == s])
    layers: list = []
    new_index: dict[int, int] = {}
    numbering: dict[int, np.ndarray] = {}  # global ordinals of each local layer's rows, in local order
    for s in sorted(fact_rows):
        rows = present(np.concatenate(fact_rows[s]), source.sizes[s])
        new_index[s], numbering[s] = len(layers), rows
        layers.append(FactLayer(source.names[s], source.fact_rows(s, rows), unit=source.layer_info(s)["unit"],
                                copy=False))
    for s in inputs:
        rows = owned[s] if s not in halo else np.concatenate([owned[s], halo[s]])
        new_index[s], numbering[s] = len(layers), rows
        # Placeholder values: each call passes the real ones (module(facts=...)). np.zeros is
        # calloc'd, so the pages are not touched until written.
        layers.append(FactLayer(source.names[s], np.zeros((rows.size,) + tuple(source.shapes[s])), copy=False))
    for k, index in enumerate(members):
        new_index[index], numbering[index] = len(layers) + k, owned[index]
    # Only the weights these rows use, renumbered (fixed weights such as GCN's normalisation scalars
    # can number tens of thousands; learnable ones are shared by name).
    used = [local[i].input_weight for i in members] + [local[i].bias for i in members]
    used = present(np.concatenate(used) + 1, len(source.weights) + 1) - 1
    used = used[used >= 0]  # -1: no weight
    renumber = np.full(len(source.weights) + 1, -1, np.int64)  # index -1 (no weight) stays -1
    renumber[used] = np.arange(used.size)
    for index in members:
        rows = local[index]
        input_layer = np.empty_like(rows.input_layer)
        input_ordinal = np.empty_like(rows.input_ordinal)
        for s in present(rows.input_layer, len(source.names)).tolist():
            mask = rows.input_layer == s
            input_layer[mask] = new_index[s]
            input_ordinal[mask] = _positions(numbering[s], rows.input_ordinal[mask])
        info = source.layer_info(index)
        layers.append(NeuronLayer(source.names[index], rows.counts, input_layer, input_ordinal,
                                  renumber[rows.input_weight], renumber[rows.bias], info["aggregation"],
                                  info["transformation"], copy=False))
    out_layer = np.concatenate([np.full(kept[i].size, new_index[i]) for i in outputs])
    out_ordinal = np.concatenate([np.searchsorted(owned[i], kept[i]) for i in outputs])
    return Graph(layers, [source.weights[i] for i in used.tolist()], out_layer, out_ordinal)
