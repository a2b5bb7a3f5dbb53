"""Dropout for compiled modules: fresh, seeded masks fed to the mask fact layers in training mode.

    graph = datasets.gcn(cora, hidden=16, layers=2, dropout=0.5, input_dropout=0.5)
    model = neurovec.dropout.compile(graph, seed=0)        # Dropout(neurovec.compile(graph, ...))
    model.train(); out = model()                            # new masks every call
    model.eval();  out = model()                            # no dropout

NOTE: [dropout as facts] A compiled program bakes the graph in and folds what is
static, and its passes merge equal neurons. A random mask must neither be folded
nor merged, and the module must stay comparable with a reference. So the templates
(:func:`neurovec.datasets.gcn` ...) express ``dropout(h)`` as ``h * mask``: a neuron
layer (``prod`` aggregation) over ``h`` and a fact layer ``dropout[p=P]:convK`` of the
same shape, all ones in the graph. Compiled with that layer in
``Settings.dynamic_facts``, no pass uses its values; this wrapper draws a mask per
layer and call (``bernoulli(1 - p) / (1 - p)``, as ``torch.nn.functional.dropout``
scales) from its own ``torch.Generator`` and passes them as ``module(facts=...)``.
In ``eval()`` it passes none: the stored ones, the model without dropout. The masks
of the last call are kept (``last_masks``), so a PyG twin can take the very same.

NOTE: [input dropout] On the input features a ``prod`` layer would cost a dense
product over the whole feature matrix (Cora: 2708 x 1433) per call, on top of the
features themselves. So there the template only declares the mask layer
``dropout[p=P]:x`` (read by nothing) and this wrapper makes the features layer ``x``
itself dynamic, passing ``x * mask``. Only entries where ``x`` is not zero need random
numbers (``x * mask`` is zero elsewhere whatever the mask): for mostly-zero features
(Cora: 1.3% nonzero) masks are drawn there only, the other entries left 1, and
``x * mask`` is made from the nonzeros alone. Measured on Cora (GCN 2 x 16, float64,
1 thread, loaded machine): a training step with a ``prod`` layer on the inputs took
about 3x the PyG twin's (the concatenation of features and mask, and the product,
dominated); with the features replaced, the two are on par (both multiply the dense
masked features by the weight).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .compiling import compile as compile_graph
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
    if not isinstance(layer, FactLayer):
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
    """A compiled module whose dropout mask layers get fresh masks in training mode (module NOTEs).

    Args:
        module: a compiled module with the mask layers in ``Settings.dynamic_facts``.
        probabilities: mask layer name -> p (default: every dynamic fact layer whose name
            is a dropout mask's).
        seed: the seed of the masks' generator: the same seed draws the same masks.
        support: mask layer name -> flat positions where masks are drawn (others stay 1).
        inputs: mask layer name -> the values of the fact layer it drops out (input
            dropout: that layer, dynamic too, is passed as ``values * mask``).
    """

    def __init__(self, module: nn.Module, probabilities: dict[str, float] | None = None, seed: int = 0,
                 support: dict | None = None, inputs: dict | None = None):
        super().__init__()
        self.module = module
        program = module.program
        if probabilities is None:
            probabilities = {name: parse_dropout_layer(name)[0] for name in program.dynamic_facts
                             if parse_dropout_layer(name) is not None}
        self.inputs = {name: torch.tensor(np.asarray(values)) for name, values in (inputs or {}).items()}
        needed = set(probabilities) - set(self.inputs) | {parse_dropout_layer(n)[1] for n in self.inputs}
        missing = sorted(needed - set(program.dynamic_facts))
        if missing:
            raise ValueError(f"dropout layers {missing} are not dynamic facts of the module: compile with "
                             f"Settings(dynamic_facts=...) naming them (neurovec.dropout.compile does)")
        self.probabilities = dict(probabilities)
        self.support = dict(support or {})
        self.shapes = {name: tuple(program.fact_shapes[name]) if name not in self.inputs
                       else tuple(self.inputs[name].shape) for name in probabilities}
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
        return draw_masks(self.shapes, self.probabilities, self.generator, reference.dtype, reference.device,
                          self.support)

    def _facts(self, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        facts = {}
        for name, mask in masks.items():
            if name not in self.inputs:
                facts[name] = mask
                continue
            values = self.inputs[name].to(mask.dtype)
            where = self.support.get(name)
            if where is None:
                facts[parse_dropout_layer(name)[1]] = values * mask
            else:  # only the nonzeros: x * mask is zero elsewhere
                index = torch.from_numpy(where)
                flat = torch.zeros(values.numel(), dtype=mask.dtype)
                flat[index] = values.reshape(-1)[index] * mask.reshape(-1)[index]
                facts[parse_dropout_layer(name)[1]] = flat.reshape(values.shape).to(mask.device)
        return facts

    def forward(self, facts: dict | None = None) -> torch.Tensor:
        if self.training and self.probabilities:
            self.last_masks = self.masks()
            facts = {**self._facts(self.last_masks), **(facts or {})}
        return self.module(facts=facts) if facts else self.module()


def compile(graph: Graph, settings=None, dtype: torch.dtype | None = None, seed: int = 0) -> Dropout:  # noqa: A001
    """``neurovec.compile`` with the graph's dropout layers dynamic, wrapped in :class:`Dropout`.

    A mask layer that nothing reads drops out the fact layer it names (NOTE: [input dropout]):
    that fact layer is made dynamic instead.
    """
    layers = dropout_layers(graph)
    read = {int(i) for layer in graph.layers if not isinstance(layer, FactLayer) for i in np.unique(layer.input_layer)}
    inputs = {}
    for name in layers:
        target = parse_dropout_layer(name)[1]
        if graph.layer_index(name) not in read:
            try:
                layer = graph.layer(target)
            except KeyError:
                raise ValueError(f"dropout layer {name!r} is read by nothing and names no fact layer") from None
            inputs[name] = layer.values
    settings = resolve_settings(settings)
    dynamic = [n for n in layers if n not in inputs] + [parse_dropout_layer(n)[1] for n in inputs]
    dynamic = tuple(dict.fromkeys(tuple(settings.dynamic_facts) + tuple(dynamic)))
    module = compile_graph(graph, settings.model_copy(update={"dynamic_facts": dynamic}), dtype)
    support = {name: s for name in inputs if (s := _support(graph, name)) is not None}
    return Dropout(module, layers, seed, support, inputs)
