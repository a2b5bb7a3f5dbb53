"""neurovec.partition plan and runtime, all ranks in one process (partition.simulate): exact against one process.

The real processes (gloo, torchrun) are in tests/test_distributed_partitioned.py; here
the exchange is indexing, so every preset and random neuron graphs are cheap to check.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neurovec
from neurovec import partition
from neurovec.engines.reference import ReferenceModule
from neurovec.engines.weights import WeightStore
from neurovec.partition import GraphSource, NodeGNN, PartitionError, compile_rank, plan_rank, simulate
from neurovec.sources.graph import NeuronLayer

from .strategies import graphs

QUICK_PRESETS = ["default", "unoptimized", "upward-17-aggressive"]


def toy(n: int = 40, seed: int = 0, classes: int = 3):
    """A random graph with self loops, a repeated edge and isolated nodes (nothing in or out)."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - 3, (2, 3 * n))
    edges = np.stack([np.concatenate([src, [4, 5, 5, 1]]), np.concatenate([dst, [4, 5, 6, 6]])])
    return rng.standard_normal((n, 5)), edges, rng.integers(0, classes, n), rng.random(n) < 0.5


def _store(graph) -> WeightStore:
    return WeightStore([w for w in graph.weights if w.learnable], torch.float64)


def _assemble(modules, outputs, like: torch.Tensor) -> torch.Tensor:
    """The graph's outputs in order, from every rank's rows."""
    full = like.new_full(like.shape, float("nan"))
    for m, out in zip(modules, outputs):
        full[torch.from_numpy(m.output_ids)] = out
    return full


def _train(step, parameters, steps=5):
    optimizer = torch.optim.Adam(parameters, lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        step().backward()
        optimizer.step()


def _check_training(kind, preset, world, method="bfs"):
    x, edges, y, train = toy()
    model = NodeGNN(kind, x, edges, widths=(6, 3), seed=1)
    graph = model.graph()
    labels, mask = torch.from_numpy(y), torch.from_numpy(train)
    # One process, the whole graph.
    full = neurovec.compile(graph, preset, torch.float64)
    _train(lambda: F.cross_entropy(full()[mask], labels[mask]), full.parameters())
    # `world` ranks in this process, sharing one set of weights: the loss is each rank's sum over
    # its labelled outputs divided by the number of all labelled nodes.
    parts = partition.partition_nodes(edges, x.shape[0], world, method)
    store = _store(graph)
    modules = [compile_rank(model, parts, r, world, preset, torch.float64, weights=store) for r in range(world)]
    n_train = int(train.sum())

    def loss():
        total = 0
        for m, out in zip(modules, simulate(modules)):
            ids = torch.from_numpy(m.output_ids)
            total = total + F.cross_entropy(out[mask[ids]], labels[ids][mask[ids]], reduction="sum") / n_train
        return total

    _train(loss, store.parameters())
    for name, value in full.weights.state_dict().items():
        torch.testing.assert_close(store.state_dict()[name], value, rtol=1e-9, atol=1e-9,
                                   msg=lambda m: f"{kind} {preset} {world} ranks, {name}: {m}")
    with torch.no_grad():
        expected = full()
        got = _assemble(modules, simulate(modules), expected)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("world, preset", [(2, p) for p in QUICK_PRESETS] + [(4, "default")])
@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_five_adam_steps_equal_one_process(kind, preset, world):
    _check_training(kind, preset, world)


@pytest.mark.slow
@pytest.mark.parametrize("preset", neurovec.list_presets())
@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_every_preset_stays_exact(kind, preset):
    """Every preset, 3 and 4 ranks (METIS where installed)."""
    for world in (3, 4):
        _check_training(kind, preset, world, "auto")


def test_node_source_and_whole_graph_make_the_same_plan():
    """NodeGNN builds a rank's rows without the whole graph; its plan equals the whole graph's, array for array."""
    x, edges, _, _ = toy()
    for kind in ("gcn", "sage"):
        model = NodeGNN(kind, x, edges, widths=(4, 4, 3))
        parts = partition.partition_nodes(edges, x.shape[0], 3, "contiguous")
        for rank in range(3):
            _same_plans(plan_rank(model, parts, rank), plan_rank(GraphSource(model.graph()), parts, rank))


def test_exchange_lists_and_counts():
    """Rank r sends p exactly p's receive list from r; the halo is the distinct remote sources of r's nodes;
    the values exchanged are halo rows x width of every exchanged layer."""
    x, edges, _, _ = toy()
    n = x.shape[0]
    parts = partition.partition_nodes(edges, n, 3, "bfs")
    model = NodeGNN("gcn", x, edges, widths=(6, 3))
    plans = [plan_rank(model, parts, r) for r in range(3)]
    assert [len(s) for s in plans[0].stages] == [1, 1, 1]  # lin, src | conv1, conv2.lin, conv2.src | conv2
    src, dst = edges[:, edges[0] != edges[1]]
    for r, plan in enumerate(plans):
        remote = src[(parts[dst] == r) & (parts[src] != r)]
        halo = np.unique(remote)
        for exchange in (x_ for stage in plan.exchanges for x_ in stage):
            assert sorted(exchange.recv_rows.tolist()) == halo.tolist()
            for p in range(3):  # what p sends r is r's receive list from p, in order
                peer = next(x_ for stage in plans[p].exchanges for x_ in stage if x_.layer == exchange.layer)
                start = sum(peer.send_counts[:r])
                sent_rows = np.flatnonzero(parts == p)[peer.send_rows[start:start + peer.send_counts[r]]]
                received = exchange.recv_rows[sum(exchange.recv_counts[:p]):sum(exchange.recv_counts[:p + 1])]
                np.testing.assert_array_equal(sent_rows, received)
                assert np.all(parts[received] == p)
        sent, received = plan.exchanged_values()
        assert received == halo.size * (6 + 3)
    assert sum(p.exchanged_values()[0] for p in plans) == sum(p.exchanged_values()[1] for p in plans)


def test_one_rank_is_the_whole_graph():
    x, edges, _, _ = toy()
    model = NodeGNN("sage", x, edges, widths=(4, 3))
    module = compile_rank(model, np.zeros(x.shape[0], np.int64), 0, 1, "default", torch.float64)
    assert module.exchanges == [] and len(module.units) == 1
    torch.testing.assert_close(module(), neurovec.compile(model.graph(), "default", torch.float64)(), rtol=0, atol=0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(graph=graphs(), world=st.integers(2, 3), seed=st.integers(0, 2**16), preset=st.sampled_from(QUICK_PRESETS))
def test_random_neuron_graphs_split_anyhow(graph, world, seed, preset):
    """Any neuron graph with any owner per neuron (ranks owning nothing of a layer included): outputs and
    weight gradients equal the reference engine's."""
    assume(all(np.isfinite(layer.values).all() for layer in graph.layers if not isinstance(layer, NeuronLayer)))
    reference = ReferenceModule(graph)
    assume(all(torch.isfinite(v).all() for layer in reference.neuron_values() for v in layer))
    assume(any(w.learnable for w in graph.weights))
    rng = np.random.default_rng(seed)
    owners = {layer.name: rng.integers(0, world, layer.size)
              for layer in graph.layers if isinstance(layer, NeuronLayer)}
    first = next(layer for layer in graph.layers if isinstance(layer, NeuronLayer))
    assume(first.size >= world)
    owners[first.name] = np.arange(first.size) % world  # `parts`: every rank owns a neuron of it
    source = GraphSource(graph, owners)
    store = _store(graph)
    modules = [compile_rank(source, owners[first.name], r, world, preset, torch.float64, weights=store)
               for r in range(world)]
    expected = reference()
    got = _assemble(modules, simulate(modules), expected)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    projection = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    names = [w.name for w in graph.weights if w.learnable]
    assume(expected.requires_grad)  # some output depends on a learnable weight
    want = torch.autograd.grad((expected * projection).sum(), [reference.weights[n] for n in names],
                               allow_unused=True)
    outs = simulate(modules)
    total = sum((out * projection[torch.from_numpy(m.output_ids)]).sum() for m, out in zip(modules, outs))
    have = torch.autograd.grad(total, [store[n] for n in names], allow_unused=True)
    for name, g, g_want in zip(names, have, want):
        if g is None or g_want is None:
            other = g if g_want is None else g_want
            assert other is None or torch.all((other == 0) | other.isnan()), name
            continue
        torch.testing.assert_close(g, g_want, rtol=1e-9, atol=1e-9, equal_nan=True, msg=lambda m: f"{name}: {m}")


def test_bad_input_gets_a_clear_error():
    x, edges, _, _ = toy()
    n = x.shape[0]
    model = NodeGNN("gcn", x, edges, widths=(4, 3))
    with pytest.raises(PartitionError, match=f"one rank per node, {n} values"):
        plan_rank(model, np.zeros(n - 1, np.int64), 0)
    with pytest.raises(PartitionError, match=f"world_size: {n + 1} ranks for a graph of {n} nodes"):
        plan_rank(model, np.zeros(n, np.int64), 0, n + 1)
    with pytest.raises(PartitionError, match="rank 1 owns no node"):
        plan_rank(model, np.zeros(n, np.int64), 0, 2)
    with pytest.raises(PartitionError, match="rank: 3 is outside 0..1"):
        plan_rank(model, np.arange(n) % 2, 3)
    with pytest.raises(PartitionError, match=r"parts: expected one rank per node.*got an array of shape \(7,\)"):
        plan_rank(GraphSource(model.graph()), np.zeros(7, np.int64), 0)
    modules = [compile_rank(model, np.arange(n) % 2, r, 2) for r in range(2)]
    with pytest.raises(PartitionError, match="pass all 2 ranks' modules in rank order"):
        simulate(modules[::-1])
    with pytest.raises(RuntimeError, match="exchanges layer 'conv1.src' with other ranks"):
        modules[0]()
    with pytest.raises(PartitionError, match="kind: unknown node-level model 'gin'"):
        NodeGNN("gin", x, edges)
    with pytest.raises(PartitionError, match="node id 99 is outside"):
        NodeGNN("gcn", x, np.array([[0], [99]]))


def test_world_size_of_the_group_must_match_the_compile(tmp_path):
    """Compiled for 2 ranks, run in a group of 1: a clear error, not a hang."""
    x, edges, _, _ = toy()
    module = compile_rank(NodeGNN("gcn", x, edges, widths=(4, 3)), np.arange(x.shape[0]) % 2, 0, 2)
    with pytest.raises(RuntimeError, match="needs a torch.distributed process group"):
        partition.PartitionedModule(module)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(PartitionError, match="compiled for 2 ranks, but the process group has 1"):
            partition.PartitionedModule(module)
    finally:
        dist.destroy_process_group()


def _same_plans(a, b) -> None:
    """Two plans of one rank are the same, exchange list for exchange list and array for array."""
    assert [len(s) for s in a.stages] == [len(s) for s in b.stages]
    for xa, xb in zip(a.exchanges, b.exchanges):
        for ea, eb in zip(xa, xb):
            assert (ea.layer, ea.send_counts, ea.recv_counts) == (eb.layer, eb.send_counts, eb.recv_counts)
            np.testing.assert_array_equal(ea.send_rows, eb.send_rows)
            np.testing.assert_array_equal(ea.recv_rows, eb.recv_rows)
    for sa, sb in zip(a.stages, b.stages):
        for ua, ub in zip(sa, sb):
            ga, gb = ua.graph, ub.graph
            assert [w.name for w in ga.weights] == [w.name for w in gb.weights]
            for la, lb in zip(ga.layers, gb.layers):
                if isinstance(la, NeuronLayer):
                    for f in ("counts", "input_layer", "input_ordinal", "input_weight", "bias"):
                        np.testing.assert_array_equal(getattr(la, f), getattr(lb, f), err_msg=f)
                else:
                    np.testing.assert_array_equal(la.values, lb.values)


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_a_shard_makes_the_same_plan_as_the_whole_edge_list(kind, tmp_path):
    """A rank that loads only its shard (its in-edges, its out-edges to other ranks, the feature rows it reads)
    plans exactly what a rank holding the whole graph plans."""
    x, edges, y, train = toy()
    parts = partition.partition_nodes(edges, x.shape[0], 3, "bfs")
    partition.write_shards(tmp_path, x, edges, parts, y=y, train_mask=train, num_classes=3,
                           neighbour_features=kind == "sage")
    whole = NodeGNN(kind, x, edges, widths=(4, 4, 3))
    for rank in range(3):
        shard = partition.load_shard(tmp_path, rank, 3)
        assert shard.edge_index.shape[1] < edges.shape[1] and shard.x.shape[0] < x.shape[0]
        np.testing.assert_array_equal(shard.y, y[parts == rank])
        source = NodeGNN(kind, shard.x, shard.edge_index, widths=(4, 4, 3), x_ids=shard.x_ids,
                         n_nodes=shard.n_nodes, cut=shard.cut)
        _same_plans(plan_rank(source, shard.parts, rank), plan_rank(whole, parts, rank))
    with pytest.raises(PartitionError, match="written for 3 ranks, but the process group has 2"):
        partition.load_shard(tmp_path, 0, 2)


def test_a_shard_without_the_features_a_rank_reads_is_refused(tmp_path):
    """A GCN shard keeps only its own nodes' features; SAGE's first aggregation reads its neighbours' too."""
    x, edges, _, _ = toy()
    parts = partition.partition_nodes(edges, x.shape[0], 2, "bfs")
    partition.write_shards(tmp_path, x, edges, parts, neighbour_features=False)
    shard = partition.load_shard(tmp_path, 0)
    source = NodeGNN("sage", shard.x, shard.edge_index, widths=(4, 3), x_ids=shard.x_ids, n_nodes=shard.n_nodes,
                     cut=shard.cut)
    with pytest.raises(PartitionError, match="holds no features for some node"):
        compile_rank(source, shard.parts, 0)
    with pytest.raises(PartitionError, match="no meta.json"):
        partition.load_shard(tmp_path / "elsewhere", 0)
