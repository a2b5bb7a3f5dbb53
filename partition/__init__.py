"""One graph across processes: partitioned full-graph training with halo exchange.

    parts = partition.partition_nodes(edge_index, n_nodes, world_size)      # METIS (pymetis) or BFS blocks
    rank_module = partition.compile_rank(source, parts, rank, settings="default")
    model = partition.PartitionedModule(rank_module)                        # under torchrun (gloo / nccl)

See ``docs/distributed.md`` ("One graph across processes"): :mod:`.partitioner`
makes and rates node partitions, :mod:`.plan` splits a neuron graph into each
rank's stage graphs and exchange lists, :mod:`.runtime` compiles and runs them,
:mod:`.gnn` builds node-level GCN/SAGE whole or one rank's rows at a time, :mod:`.shards`
writes and reads each rank's share of a graph.
"""
from .gnn import NodeGNN
from .partitioner import (METHODS, PartitionError, PartitionQuality, check_parts, metis_available, partition_nodes,
                          partition_quality)
from .plan import Exchange, GraphSource, RankPlan, plan_rank
from .shards import Shard, load_shard, write_shards
from .runtime import ExchangeCounter, PartitionedModule, RankModule, compile_rank, mean_loss, simulate

__all__ = ["METHODS", "PartitionError", "PartitionQuality", "check_parts", "metis_available", "partition_nodes",
           "partition_quality", "Exchange", "GraphSource", "RankPlan", "plan_rank", "NodeGNN", "ExchangeCounter",
           "PartitionedModule", "RankModule", "compile_rank", "mean_loss", "simulate", "Shard", "load_shard",
           "write_shards"]
