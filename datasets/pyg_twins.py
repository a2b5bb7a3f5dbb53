"""PyTorch Geometric models that compute exactly what the GNN templates compute.

``make_twin(spec)`` builds the PyG model for a :class:`~neurovec.datasets.gnn.GNNSpec`
(or use :func:`gcn_twin`, :func:`sage_twin`, :func:`gin_twin` with the template's
arguments). Its parameter names are the template's weight names, so
:func:`copy_weights` / :func:`copy_weights_from_twin` copy by name, and
:func:`pyg_batch` gives the input ``(x, edge_index, batch)`` for a sample list.

Requires ``torch_geometric``; imported lazily so the rest of neurovec does not.
"""
from __future__ import annotations

import torch
from torch import nn

from ._common import DatasetError
from .gnn import GNNSpec, dropout_layer_name, tu_batch
from .nodes import NodeDataset
from .tu import TUDataset

__all__ = ["GNNTwin", "make_twin", "gcn_twin", "sage_twin", "gin_twin", "pyg_batch", "pyg_node_data",
           "copy_weights", "copy_weights_from_twin"]

_ACTIVATIONS = {"relu": torch.relu, "identity": lambda x: x, "tanh": torch.tanh, "sigmoid": torch.sigmoid}


class GNNTwin(nn.Module):
    """``conv1 .. convL`` (PyG convolutions), pooling, ``lin`` and the output transformation.

    ``forward(x, edge_index, batch, n_samples)`` returns ``(n_samples, out_dim)``.
    Node level (``spec.readout`` None): ``forward(x, edge_index, masks=None)`` returns one
    row per node, the last convolution's output (no pooling, no ``lin``). ``masks`` maps
    the template's dropout layer names (``dropout[p=0.5]:x``, ``dropout[p=0.5]:conv1``)
    to the masks to multiply by, as :mod:`neurovec.dropout` draws them for the
    neurovec module; without them the twin applies no dropout (eval mode). ``edge_weight``
    goes to GCN convolutions as is (set their ``normalize`` False to pass precomputed
    normalisation weights, self loops listed).
    """

    def __init__(self, spec: GNNSpec):
        super().__init__()
        from torch_geometric.nn import GCNConv, GINConv, SAGEConv

        if spec.activation not in _ACTIVATIONS:
            raise DatasetError(f"the PyG twin has no activation {spec.activation!r} "
                               f"(expected one of {sorted(_ACTIVATIONS)})")
        self.spec = spec
        in_dim = spec.in_dim
        for k, width in enumerate(spec.hidden, start=1):
            if spec.kind == "gcn":
                conv = GCNConv(in_dim, width, normalize=spec.normalize)
            elif spec.kind == "sage":
                conv = SAGEConv(in_dim, width, aggr="mean")
            else:
                mlp = nn.Sequential(nn.Linear(in_dim, width), nn.ReLU(), nn.Linear(width, width))
                conv = GINConv(mlp, eps=spec.eps, train_eps=False)
            self.add_module(f"conv{k}", conv)
            in_dim = width
        if not spec.node_level:
            self.lin = nn.Linear(in_dim, spec.out_dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor | dict | None = None,
                n_samples: int | None = None, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

        spec = self.spec
        masks = batch if spec.node_level else None
        if masks and spec.input_dropout:
            x = x * masks[dropout_layer_name(spec.input_dropout, "x")]
        last = len(spec.hidden)
        for k in range(1, last + 1):
            conv = getattr(self, f"conv{k}")
            x = conv(x, edge_index) if edge_weight is None else conv(x, edge_index, edge_weight)
            if k < last:
                x = _ACTIVATIONS[spec.activation](x)
                if masks and spec.dropout:
                    x = x * masks[dropout_layer_name(spec.dropout, f"conv{k}")]
        if spec.node_level:
            return x
        pool = {"mean": global_mean_pool, "sum": global_add_pool, "max": global_max_pool}[spec.readout]
        x = self.lin(pool(x, batch, size=n_samples))
        return torch.sigmoid(x) if spec.output_transformation == "sigmoid" else x


def make_twin(spec: GNNSpec) -> GNNTwin:
    return GNNTwin(spec)


def gcn_twin(ds: TUDataset, hidden=16, layers: int = 2, **options) -> GNNTwin:
    """The twin of ``gcn(ds, hidden, layers, **options)`` (``samples``/``seed`` are ignored)."""
    return GNNTwin(_spec("gcn", ds, hidden, layers, options))


def sage_twin(ds: TUDataset, hidden=16, layers: int = 2, **options) -> GNNTwin:
    return GNNTwin(_spec("sage", ds, hidden, layers, options))


def gin_twin(ds: TUDataset, hidden=16, layers: int = 2, **options) -> GNNTwin:
    return GNNTwin(_spec("gin", ds, hidden, layers, options))


def _spec(kind, ds, hidden, layers, options) -> GNNSpec:
    from .gnn import AUTO
    options = {k: v for k, v in options.items() if k not in ("samples", "seed")
               and not (k == "readout" and v is AUTO) and not (k == "output_transformation" and v is None)}
    return GNNSpec.create(kind, ds, hidden, layers, **options)


def pyg_node_data(ds: NodeDataset, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, edge_index)`` of a node dataset for a node-level twin (outputs: one row per node)."""
    return torch.tensor(ds.x, dtype=dtype), torch.tensor(ds.edge_index, dtype=torch.long)


def pyg_batch(ds: TUDataset, samples=None, use_attributes: bool = False,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(x, edge_index, batch, n_samples)`` for the twin, matching the template's ``samples`` order."""
    b = tu_batch(ds, samples, use_attributes)
    return (torch.tensor(b.x, dtype=dtype), torch.from_numpy(b.edge_index).long(),
            torch.from_numpy(b.batch).long(), int(b.samples.size))


def _learnable(module: nn.Module) -> dict[str, torch.Tensor]:
    """The learnable weights of a neurovec module (``module.weights``) by weight name."""
    store = getattr(module, "weights", None)
    if not isinstance(store, nn.Module):
        raise DatasetError(f"{type(module).__name__} has no `weights` module; expected a neurovec module "
                           "(ReferenceModule or a compiled module)")
    return dict(store.named_parameters())


def _match(names: set, twin_names: set) -> None:
    if names != twin_names:
        missing, extra = sorted(names - twin_names), sorted(twin_names - names)
        raise DatasetError(f"weights do not match the twin: only in the neurovec module {missing}, "
                           f"only in the twin {extra}")


@torch.no_grad()
def copy_weights(module: nn.Module, twin: nn.Module) -> None:
    """Copy every learnable weight of the neurovec ``module`` into the twin's parameter of that name."""
    weights, params = _learnable(module), dict(twin.named_parameters())
    _match(set(weights), set(params))
    for name, value in weights.items():
        params[name].copy_(value.reshape(params[name].shape))


@torch.no_grad()
def copy_weights_from_twin(twin: nn.Module, module: nn.Module) -> None:
    """The reverse of :func:`copy_weights`: the twin's parameters into the neurovec module."""
    weights, params = _learnable(module), dict(twin.named_parameters())
    _match(set(weights), set(params))
    for name, value in weights.items():
        value.copy_(params[name].reshape(value.shape))
