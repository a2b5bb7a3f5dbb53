"""Data-parallel training on torch.distributed: every rank compiles and runs only its part of each batch.

Launch one process per rank with torchrun (gloo on CPU, nccl on CUDA with one GPU per rank)::

    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py --dataset PROTEINS

and in the script::

    from neurovec import distributed
    ctx = distributed.init()                                   # reads torchrun's environment
    model = neurovec.MiniBatchModel(build).to(ctx.device)
    loader = distributed.loader(model, train_ids, batch_size=256, shuffle=True, seed=0)
    ddp = distributed.DataParallel(model)                      # DistributedDataParallel
    for batch in loader:                                       # this rank's part of each batch
        per_sample = F.cross_entropy(ddp(batch), labels[batch.samples], reduction="none")
        loss = distributed.mean_loss(per_sample, batch)        # mean over the *whole* batch
        optimizer.zero_grad(); loss.backward(); optimizer.step()

How it splits: all ranks draw the same batches (the same :class:`~neurovec.SampleLoader`
seed); rank ``r`` takes part ``r`` of ``np.array_split(batch, world_size)``, so a
rank only ever builds and compiles the graphs of its own samples (its shard), and
every rank takes the same number of steps. ``batch_size=None`` is full-batch
training: each rank's shard is one fixed batch, compiled once.

Gradients are all-reduced by :class:`torch.nn.parallel.DistributedDataParallel`,
which *averages* them over ranks. With unequal parts (``101`` samples on 2 ranks:
51 and 50) the average of per-rank means is not the mean over the batch, so
:func:`mean_loss` scales each rank's sum by ``world_size / global batch size``:
then the averaged gradient is exactly the gradient of the mean loss over the whole
batch, and training equals one process's training on the same batches
(``tests/test_distributed.py``, float64). ``docs/distributed.md`` also covers one
graph too large for a machine (not built yet).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .loader import MiniBatch, MiniBatchModel, SampleLoader

__all__ = ["Context", "init", "loader", "DataParallel", "mean_loss", "rank_and_world"]


@dataclass(frozen=True)
class Context:
    """This process's place in the group: ``rank`` of ``world_size``, its ``device`` and the ``backend``."""

    rank: int
    world_size: int
    device: torch.device
    backend: str


def init(backend: str | None = None) -> Context:
    """Join the process group that torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...).

    ``backend`` defaults to ``nccl`` when CUDA is available (rank ``r`` uses GPU
    ``LOCAL_RANK``) and ``gloo`` otherwise (CPU). An already initialized group is
    kept as it is.
    """
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (CUDA), got {backend!r}")
    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise RuntimeError(f"neurovec.distributed.init: {', '.join(missing)} not set; launch with torchrun, "
                               "e.g. torchrun --standalone --nproc_per_node 2 your_script.py")
        dist.init_process_group(backend)
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return Context(dist.get_rank(), dist.get_world_size(), device, dist.get_backend())


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the current group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def loader(model: MiniBatchModel, samples, batch_size: int | None = None, shuffle: bool = False,
           drop_last: bool = False, seed: int = 0, partitions: int = 1) -> SampleLoader:
    """A :class:`~neurovec.SampleLoader` that yields this rank's part of every batch (module doc)."""
    rank, world_size = rank_and_world()
    return SampleLoader(model, samples, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed,
                        partitions=partitions, rank=rank, world_size=world_size)


def DataParallel(model: MiniBatchModel, **options) -> DistributedDataParallel:  # noqa: N802 - a wrapper class
    """``DistributedDataParallel(model)``: gradients all-reduced (averaged) in buckets during backward.

    ``options`` go to DistributedDataParallel (e.g. ``find_unused_parameters=True``
    for a template whose batches may leave some weight unused). The model must be on
    this rank's device already (``model.to(ctx.device)``).
    """
    if not isinstance(model, MiniBatchModel):
        raise TypeError(f"neurovec.distributed.DataParallel wraps a MiniBatchModel (got {type(model).__name__})")
    return DistributedDataParallel(model, **options)


def mean_loss(per_sample: torch.Tensor, batch: MiniBatch) -> torch.Tensor:
    """This rank's share of the mean loss over the whole (all-rank) batch, for DDP's averaging.

    ``per_sample`` holds this rank's losses, one row per sample of ``batch`` (any
    trailing shape, e.g. ``reduction="none"`` losses). Returns
    ``sum * world_size / (global batch size * values per sample)``: DDP's average over
    ranks of its gradient is then the gradient of the batch's mean loss. In one
    process it is the plain mean.
    """
    if per_sample.shape[:1] != (len(batch),):
        raise ValueError(f"mean_loss: per_sample has {tuple(per_sample.shape)} values for a batch part of "
                         f"{len(batch)} samples; pass unreduced losses, one row per sample")
    _, world_size = rank_and_world()
    per_row = per_sample[0].numel() if per_sample.numel() else 1
    return per_sample.sum() * (world_size / (batch.global_size * per_row))
