"""Holding a graph's weights in a module under the user's own names."""
from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import nn

from ..sources.graph import GraphError, Weight

__all__ = ["WeightStore"]


# NOTE: [weights are not attributes] A weight's name is the user's (``half``, ``train``,
# ``forward``, ``training`` are fine names for a weight), while ``nn.Module`` keeps its
# parameters, buffers and submodules in the same namespace as its own methods and state:
# ``register_parameter("half", ...)`` refuses a name that is an attribute, and a parameter
# named ``training`` would make ``.train()`` fail. So the store writes each weight straight
# into ``_parameters`` / ``_buffers`` (and each dotted part into ``_modules``) under its own
# name, and nothing reads a weight as an attribute: the generated code reads ``w[name]``,
# which goes through a map built once. Everything torch does with a module walks those
# dicts (``state_dict``, ``load_state_dict``, ``named_parameters``, ``.to``, torch.export's
# and ``functional_call``'s swaps), so state-dict keys stay ``weights.<the user's name>``.
# ``_Group.__setattr__`` keeps plain attributes (``training``, hooks' flags, the store's own
# maps) out of the way of a weight of that name, and lets ``setattr(group, name, p)`` replace
# a weight of that name (the mini-batch loader shares parameters that way).


class _Group(nn.Module):
    """A module holding weights under any names: the store, and each dotted prefix of a name."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, nn.Parameter) and name in self._parameters:
            self._parameters[name] = value
        elif isinstance(value, torch.Tensor) and name in self._buffers:
            self._buffers[name] = value
        elif value is not None and not isinstance(value, (torch.Tensor, nn.Module)):
            object.__setattr__(self, name, value)  # plain state: never a weight
        else:
            super().__setattr__(name, value)

    def forward(self):  # pragma: no cover - a container, never called
        raise RuntimeError(f"{type(self).__name__} is a container")


class WeightStore(_Group):
    """Learnable weights as ``nn.Parameter``, fixed ones as buffers, keyed by weight name.

    Dotted names (``conv1.lin.weight``) become nested submodules, so state-dict
    keys read ``weights.conv1.lin.weight``, just like a hand-written torch model.
    Fixed weights are non-persistent buffers: they belong to the compiled graph
    (e.g. GCN normalisation scalars, which depend on the samples' degrees), so the
    state dict holds exactly the learnable weights and moves between modules
    compiled from one template on different samples.
    ``store[name]`` returns the tensor; iteration yields every weight name. Any name
    works, including those of ``nn.Module``'s own methods (NOTE: [weights are not attributes]).
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
            for k, part in enumerate(path):
                child = owner._modules.get(part)
                if child is None:
                    if part in owner._parameters or part in owner._buffers:
                        clash = ".".join(path[:k + 1])
                        raise GraphError(f"weight name {w.name!r} clashes with weight {clash!r}: a state-dict "
                                         f"key cannot be both a weight and a prefix of others; rename one")
                    child = owner._modules[part] = _Group()  # not add_module: see the NOTE
                owner = child
            if leaf in owner._modules:
                raise GraphError(f"weight name {w.name!r} clashes with weights named {w.name + '.*'!r}: a "
                                 f"state-dict key cannot be both a weight and a prefix of others; rename one")
            tensor = torch.tensor(w.value, dtype=dtype or torch.get_default_dtype())
            if w.learnable:
                owner._parameters[leaf] = nn.Parameter(tensor)
            else:
                owner._buffers[leaf] = tensor
                owner._non_persistent_buffers_set.add(leaf)
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

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Before torch copies anything: a learnable weight of another shape is refused with its
        # name (torch would also turn a (1,) tensor into a scalar weight without a word).
        for name in self._names:
            value = state_dict.get(prefix + name)
            if name not in self._fixed and isinstance(value, torch.Tensor) and tuple(value.shape) != self[name].shape:
                raise GraphError(
                    f"load_state_dict: weight {name!r} (key {prefix + name!r}) has shape {tuple(value.shape)} in the "
                    f"state dict, but {tuple(self[name].shape)} in this module's graph; load weights trained on a "
                    "graph built by the same template with the same sizes (hidden, layers, feature columns)")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

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
