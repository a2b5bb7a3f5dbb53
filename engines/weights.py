"""Holding a graph's weights in a module under the user's own names."""
from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import nn

from ..sources.graph import GraphError, Weight

__all__ = ["WeightStore"]


class WeightStore(nn.Module):
    """Learnable weights as ``nn.Parameter``, fixed ones as buffers, keyed by weight name.

    Dotted names (``conv1.lin.weight``) become nested submodules, so state-dict
    keys read ``weights.conv1.lin.weight``, just like a hand-written torch model.
    Fixed weights are non-persistent buffers: they belong to the compiled graph
    (e.g. GCN normalisation scalars, which depend on the samples' degrees), so the
    state dict holds exactly the learnable weights and moves between modules
    compiled from one template on different samples.
    ``store[name]`` returns the tensor; iteration yields every weight name.
    """

    def __init__(self, weights: Sequence[Weight], dtype: torch.dtype | None = None):
        super().__init__()
        self._names = [w.name for w in weights]
        self._fixed = {w.name: w.value for w in weights if not w.learnable}
        for w in weights:
            *path, leaf = w.name.split(".")
            if not leaf or any(not part for part in path):
                raise GraphError(f"weight name {w.name!r} has an empty part between dots")
            owner = self
            for part in path:
                child = owner._modules.get(part)
                if child is None:
                    if part in owner._parameters or part in owner._buffers:
                        raise GraphError(f"weight name {w.name!r} clashes with weight {part!r}")
                    child = nn.Module()
                    owner.add_module(part, child)
                owner = child
            if leaf in owner._modules:
                raise GraphError(f"weight name {w.name!r} clashes with weights named {w.name + '.*'!r}")
            tensor = torch.tensor(w.value, dtype=dtype or torch.get_default_dtype())
            if w.learnable:
                owner.register_parameter(leaf, nn.Parameter(tensor))
            else:
                owner.register_buffer(leaf, tensor, persistent=False)
        self._locate()

    def _locate(self) -> None:
        # name -> (the submodule that holds it, its last part): the generated forward reads
        # every weight by name on every call, and walking the dotted path each time cost
        # ~0.5 µs a weight (MUTAG SAGE reads ten).
        self._where: dict[str, tuple[nn.Module, str]] = {}
        for name in self._names:
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                owner = owner._modules[part]
            self._where[name] = (owner, leaf)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._locate()  # also for modules pickled before this map existed

    def __getitem__(self, name: str) -> torch.Tensor:
        owner, leaf = self._where[name]
        found = owner._parameters.get(leaf)
        return found if found is not None else owner._buffers[leaf]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def keys(self):
        return list(self._names)

    def items(self):
        return [(name, self[name]) for name in self._names]

    def _apply(self, fn, recurse=True):
        # Fixed weights are constants: re-create them exactly after a dtype change.
        super()._apply(fn, recurse)
        for name, value in self._fixed.items():
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                owner = owner._modules[part]
            current = owner._buffers[leaf]
            owner._buffers[leaf] = torch.tensor(value, dtype=current.dtype, device=current.device)
        return self

    def forward(self):  # pragma: no cover - a container, never called
        raise RuntimeError("WeightStore is a container")
