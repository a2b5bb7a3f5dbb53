"""One graph across processes: partitioned full-graph training with halo exchange.

    parts = partition.partition_nodes(edge_index, n_nodes, world_size)      # METIS (pymetis) or BFS blocks
    print(partition.partition_quality(edge_index, parts))                   # edge cut, balance, halo rows

:mod:`.partitioner` makes and rates node partitions.
"""
from .partitioner import (METHODS, PartitionError, PartitionQuality, check_parts, metis_available, partition_nodes,
                          partition_quality)

__all__ = ["METHODS", "PartitionError", "PartitionQuality", "check_parts", "metis_available", "partition_nodes",
           "partition_quality"]
