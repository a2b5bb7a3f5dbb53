"""Dropout for compiled modules: fresh, seeded masks fed to the mask fact layers in training mode.

    graph = datasets.gcn(cora, hidden=16, layers=2, dropout=0.5, input_dropout=0.5)
    model = neurovec.dropout.compile(graph, seed=0)        # Dropout(neurovec.compile(graph, ...))
    model.train(); out = model()                            # new masks every call
    model.eval();  out = model()                            # no dropout

NOTE: [dropout as facts] A compiled program bakes the graph in and folds what is
static, and its passes merge equal neurons. A random mask must neither be folded
nor merged, and the module must stay comparable with a reference. So the templates
(:func:`neurovec.datasets.gcn` ...) express ``dropout(h)`` as ``h * mask``: a neuron
layer (``prod`` aggregation) over ``h`` and a fact layer ``dropout[p=P]:NAME`` of the
same shape, all ones in the graph. Compiled with that layer in
``Settings.dynamic_facts``, no pass uses its values; this wrapper draws a mask per
layer and call (``bernoulli(1 - p) / (1 - p)``, as ``torch.nn.functional.dropout``
scales) from its own ``torch.Generator`` and passes them as ``module(facts=...)``.
In ``eval()`` it passes none: the stored ones, the model without dropout. The masks
of the last call are kept (``last_masks``), so a PyG twin can take the very same.

Input dropout of sparse features only needs random numbers where a feature is not
zero (``x * mask`` is zero elsewhere whatever the mask): for a fact layer whose
values are mostly zeros (Cora: 1.3% nonzero) the wrapper draws only those and leaves
the other entries 1.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .compiler.pipeline import compile as compile_graph
from .compiler.pipeline import resolve_settings
from .datasets.gnn import parse_dropout_layer
from .sources.graph import FactLayer, Graph

__all__ = ["Dropout", "compile", "dropout_layers", "draw_masks"]

#: A fact layer read by input dropout with at most this share of nonzeros gets masks drawn on its nonzeros only.
SPARSE_SHARE = 0.25


def dropout_layers(graph: Graph) -> dict[str, float]:
    """The dropout mask layers of ``graph`` with their probabilities, by layer name."""
    found = {}
    for layer in graph.layers:
        parsed = parse_dropout_layer(layer.name) if isinstance(layer, FactLayer) else None
        if parsed is not None:
            found[layer.name] = parsed[0]
    return found


def _support(graph: Graph, name: str) -> np.ndarray | None:
    """Flat positions of the nonzero input features under mask layer ``name``, when they are few."""
    what = parse_dropout_layer(name)[1]
    try:
        layer = graph.layer(what)
    except KeyError:
        return None
    if not isinstance(layer, FactLayer) or layer.values.shape != graph.layer(name).values.shape:
        return None
    flat = np.flatnonzero(layer.values.reshape(-1))
    return flat if flat.size <= SPARSE_SHARE * layer.values.size else None


def draw_masks(shapes: dict[str, tuple], probabilities: dict[str, float], generator: torch.Generator,
               dtype: torch.dtype, device=None, support: dict | None = None) -> dict[str, torch.Tensor]:
    """One mask per layer: ``bernoulli(1 - p) / (1 - p)`` entries (on ``support[name]`` only, if given)."""
    masks = {}
    for name, p in probabilities.items():
        shape = tuple(shapes[name])
        where = None if support is None else support.get(name)
        if where is None:
            keep = torch.rand(shape, generator=generator, dtype=torch.float64) >= p
            masks[name] = keep.to(dtype) / (1.0 - p)
        else:
            mask = torch.ones(int(np.prod(shape)), dtype=dtype)
            keep = torch.rand(where.size, generator=generator, dtype=torch.float64) >= p
            mask[torch.from_numpy(where)] = keep.to(dtype) / (1.0 - p)
            masks[name] = mask.reshape(shape)
        if device is not None:
            masks[name] = masks[name].to(device)
    return masks


class Dropout(nn.Module):
    """A compiled module whose dropout mask layers get fresh masks in training mode (module NOTE).

    Args:
        module: a compiled module with the mask layers in ``Settings.dynamic_facts``.
        probabilities: mask layer name -> p (default: every dynamic fact layer whose name
            is a dropout mask's).
        seed: the seed of the masks' generator: the same seed draws the same masks.
        support: mask layer name -> flat positions where masks are drawn (others stay 1).
    """

    def __init__(self, module: nn.Module, probabilities: dict[str, float] | None = None, seed: int = 0,
                 support: dict | None = None):
        super().__init__()
        self.module = module
        program = module.program
        if probabilities is None:
            probabilities = {name: parse_dropout_layer(name)[0] for name in program.dynamic_facts
                             if parse_dropout_layer(name) is not None}
        missing = sorted(set(probabilities) - set(program.dynamic_facts))
        if missing:
            raise ValueError(f"dropout layers {missing} are not dynamic facts of the module: compile with "
                             f"Settings(dynamic_facts=...) naming them (neurovec.dropout.compile does)")
        self.probabilities = dict(probabilities)
        self.support = dict(support or {})
        self.generator = torch.Generator().manual_seed(seed)
        self.last_masks: dict[str, torch.Tensor] = {}

    @property
    def weights(self):
        return self.module.weights

    @property
    def program(self):
        return self.module.program

    @property
    def code(self) -> str:
        return self.module.code

    def masks(self) -> dict[str, torch.Tensor]:
        """Draw the next masks (as a training call would)."""
        reference = next(iter(self.module.weights.parameters()))
        return draw_masks(self.module.program.fact_shapes, self.probabilities, self.generator, reference.dtype,
                          reference.device, self.support)

    def forward(self, facts: dict | None = None) -> torch.Tensor:
        if self.training and self.probabilities:
            self.last_masks = self.masks()
            facts = {**self.last_masks, **(facts or {})}
        return self.module(facts=facts) if facts else self.module()


def compile(graph: Graph, settings=None, dtype: torch.dtype | None = None, seed: int = 0) -> Dropout:  # noqa: A001
    """``neurovec.compile`` with the graph's dropout mask layers dynamic, wrapped in :class:`Dropout`."""
    layers = dropout_layers(graph)
    settings = resolve_settings(settings)
    dynamic = tuple(dict.fromkeys(tuple(settings.dynamic_facts) + tuple(layers)))
    module = compile_graph(graph, settings.model_copy(update={"dynamic_facts": dynamic}), dtype)
    support = {name: s for name in layers if (s := _support(graph, name)) is not None}
    return Dropout(module, layers, seed, support)
