"""The benchmark models in PyNeuraLogic, and NeuraLogic's own (Java, CPU) engine.

NeuraLogic is timed on its own terms: the model is built with NeuraLogic's
default settings (isomorphic value compression and chain pruning on: its fastest
configuration), one epoch is ``model.train(built, epochs=1)`` over the whole
dataset in one batch, a forward pass is ``model.test(built)``. neurovec then
compiles the *same* built samples (``neurovec.sources.neuralogic.from_neuralogic``),
and NeuraLogic's outputs are the oracle of that task.

Models:

* TU ``gcn``: ``layers`` GCN convolutions, ReLU between them, mean readout, a
  sigmoid output (``predict``). GCN's normalisation ``1/sqrt(deg_i deg_j)`` (with
  self-loops) is precomputed into the values of the ``edge`` facts, as PyG's
  ``gcn_norm`` does, so the rule is one product per edge::

      {H, F} h1(I) :- h0(J), edge(J, I).   [combination=product, aggregation=sum]
      h1/1 [transformation=relu]
      ...
      {1, H} predict :- hL(X).   [aggregation=avg]
      predict/0 [transformation=sigmoid]

  (``neuralogic.nn.GCNConv`` computes the degrees with extra rules that ground
  a neuron per node *pair*: ~20x the neurons on MUTAG, not a fair baseline.)
  There are no biases, so this is not numerically the template's model.
* Mutagenesis ``simple``: NeuraLogic's built-in ``neuralogic.utils.data.Mutagenesis``
  (template and molecules) when ``dim`` is 3; ``dims``: the thesis 6.3 "dims"
  rules written out below, on the same molecules.
"""
from __future__ import annotations

import gc
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from .contenders import Engine, Skipped
from .measure import rss_bytes
from .tasks import TU_DATASETS, Oracle, Task

__all__ = ["unavailable_reason", "supports", "NeuraLogicBuild", "NeuraLogicEngine", "attach"]

_ATOM_TYPES = ("c", "o", "br", "i", "f", "h", "n", "cl")   # NeuraLogic's Mutagenesis predicates
_BOND_TYPES = ("b_1", "b_2", "b_3", "b_4", "b_5", "b_7")


def unavailable_reason() -> str | None:
    """Why NeuraLogic cannot run here, or None when it can."""
    try:
        import neuralogic  # noqa: F401
    except Exception as error:  # ImportError, or the JVM failing to start
        return (f"neuralogic is not importable ({type(error).__name__}: {error}); "
                'pip install -e ".[neuralogic]" in the neurovec checkout (needs Java 17)')
    return None


def supports(dataset: str, model: str) -> bool:
    return (dataset in TU_DATASETS and model == "gcn") or (dataset == "mutagenesis" and model in ("simple", "dims"))


@dataclass
class NeuraLogicBuild:
    """A built NeuraLogic model and dataset, with what building them cost."""

    model: object
    built: object
    build_s: float
    rss_growth_bytes: int
    description: str
    initial_outputs: np.ndarray | None = None

    def outputs(self) -> np.ndarray:
        return np.asarray(self.model.test(self.built), dtype=np.float64).reshape(len(self.built), -1)

    def oracle(self) -> Oracle:
        """NeuraLogic's outputs at the initial weights (its own timing trains the model afterwards)."""
        return Oracle("NeuraLogic (model.test, float64)", self.initial_outputs)


def attach(task: Task, data, options) -> None:
    """Build the NeuraLogic model of ``task`` and import its samples as ``task.graph``.

    Failures are kept in ``task.notes``: without NeuraLogic the task has neither;
    when only the import fails, NeuraLogic is still timed and neurovec's own
    template stands in for the comparison (``report`` says so).
    """
    reason = unavailable_reason()
    if reason is not None:
        task.notes.append(reason)
        return
    if not supports(task.dataset, task.model):
        task.notes.append(f"no NeuraLogic model for {task.dataset}/{task.model} (available: TU gcn, "
                          "mutagenesis simple and dims)")
        return
    if task.scale != 1:
        task.notes.append("NeuraLogic tasks run unreplicated (scale 1) only")
        return
    task.neuralogic = _build(task, data, options)
    task.info["neuralogic_build_s"] = task.neuralogic.build_s
    task.labels = np.array([float(np.ravel(s.target)[0]) for s in task.neuralogic.built], dtype=np.float64)
    task.samples = np.arange(task.labels.size)
    try:
        from neurovec.sources.neuralogic import from_neuralogic
        start = time.perf_counter()
        task.graph = from_neuralogic(task.neuralogic.model, task.neuralogic.built, warn=False)
        task.info["import_s"] = time.perf_counter() - start
    except Exception as error:  # an import failure must not hide NeuraLogic's own timing
        task.notes.append(f"from_neuralogic failed, neurovec engines skipped here: {type(error).__name__}: "
                          f"{str(error)[:300]}")


def _build(task: Task, data, options) -> NeuraLogicBuild:
    from neuralogic.core import Settings
    from neuralogic.logging import clear_handlers
    from neuralogic.nn.loss import MSE
    from neuralogic.nn.optim import Adam

    clear_handlers()  # the Java side logs every sample at INFO
    if task.dataset in TU_DATASETS:
        model, dataset = _tu_gcn(data, options), _tu_dataset(data)
        description = f"GCN ({options.layers} layers, width {options.hidden}), normalisation in edge values"
    else:
        model, dataset, description = _mutagenesis(task.model, options)
    gc.collect()
    rss = rss_bytes()
    start = time.perf_counter()
    # The optimizer and loss of the torch engines: Adam (lr 1e-3) on the mean squared error.
    model.build(Settings(optimizer=Adam(lr=1e-3), error_function=MSE()))
    # One batch of all samples, like the torch engines' full-batch step. (An oversized batch is not
    # capped: the JVM allocates for it and runs out of memory, so count the samples.)
    built = model.build_dataset(dataset, batch_size=_count_samples(dataset))
    build_s = time.perf_counter() - start
    result = NeuraLogicBuild(model, built, build_s, max(rss_bytes() - rss, 0), description)
    result.initial_outputs = result.outputs()
    return result


def _count_samples(dataset) -> int:
    if hasattr(dataset, "data"):  # TensorDataset
        return len(dataset.data)
    with open(dataset.queries_file) as handle:  # FileDataset: one query per line
        return sum(1 for line in handle if line.strip())


def _tu_gcn(data, options):
    from neuralogic.core import Aggregation, Combination, Metadata, Model, R, Transformation, V

    model = Model()
    source, width = "h0", data.node_features().shape[1]
    for k in range(1, options.layers + 1):
        head = f"h{k}"
        activation = Transformation.RELU if k < options.layers else Transformation.IDENTITY
        rule = R.get(head)(V.I)[options.hidden, width] <= (R.get(source)(V.J), R.edge(V.J, V.I))
        model.add_rules([rule | Metadata(combination=Combination.PRODUCT, aggregation=Aggregation.SUM),
                         R.get(head) / 1 | Metadata(transformation=activation)])
        source, width = head, options.hidden
    model.add_rules([(R.predict[1, width] <= R.get(source)(V.X)) | Metadata(aggregation=Aggregation.AVG),
                     R.predict / 0 | Metadata(transformation=Transformation.SIGMOID)])
    return model


def _tu_dataset(data):
    """One example per graph: ``h0(i)`` features, ``edge(j, i)`` = 1/sqrt(deg_i deg_j) incl. self-loops."""
    from neuralogic.dataset import Data, TensorDataset

    features = data.node_features()
    target = (data.graph_labels == data.graph_labels.max()).astype(float)
    nodes, edges = data.nodes, data.edges
    examples = []
    for g in range(data.n_graphs):
        node_ids = nodes.order[nodes.ptr[g]:nodes.ptr[g + 1]]
        edge_ids = edges.order[edges.ptr[g]:edges.ptr[g + 1]]
        n = node_ids.size
        src, dst = nodes.local[data.edge_index[0, edge_ids]], nodes.local[data.edge_index[1, edge_ids]]
        src, dst = np.concatenate([src, np.arange(n)]), np.concatenate([dst, np.arange(n)])
        degree = np.bincount(dst, minlength=n)  # in-degree, self-loop included
        norm = 1.0 / np.sqrt(degree[src] * degree[dst])
        examples.append(Data(x=features[node_ids].tolist(), edge_index=[src.tolist(), dst.tolist()],
                             y=float(target[g]), edge_attr=norm.tolist()))
    return TensorDataset(examples, feature_name="h0", edge_name="edge")


def _mutagenesis(architecture: str, options):
    from neuralogic.core import Model
    from neuralogic.utils.data import Mutagenesis

    builtin_model, dataset = Mutagenesis()
    if architecture == "simple" and options.dim == 3:
        return builtin_model, dataset, "NeuraLogic's built-in Mutagenesis template (thesis 6.3 'simple')"
    text = _mutagenesis_template(architecture, options.dim, options.bond_dim)
    handle, path = tempfile.mkstemp(suffix=".txt", prefix=f"mutagenesis_{architecture}_")
    with os.fdopen(handle, "w") as file:
        file.write(text)
    # NeuraLogic parses the template file when the model is built, so the file stays until exit.
    return Model(model_file=path), dataset, f"thesis 6.3 '{architecture}' template (dim {options.dim})"


def _mutagenesis_template(architecture: str, dim: int, bond_dim: int) -> str:
    """Thesis 6.3 rules in NeuraLogic's syntax, on NeuraLogic's Mutagenesis predicates."""
    dims = architecture == "dims"
    bond_size = bond_dim if dims else dim
    bond_literal = f"{{{dim},{bond_size}}} bond_embed(B)" if dims else "bond_embed(B)"
    lines = [f"{{{dim},1}} atom_embed(A) :- {t}(A). [activation=tanh]" for t in _ATOM_TYPES]
    lines += [f"{{{bond_size},1}} bond_embed(B) :- {t}(B). [activation=tanh]" for t in _BOND_TYPES]
    lines += ["atom_embed / 1 [activation=tanh]", "bond_embed / 1 [activation=tanh]"]
    previous = "atom_embed"
    for k in (1, 2, 3):
        lines.append(f"l{k}_embed(X) :- {{{dim},{dim}}} {previous}(X), {{{dim},{dim}}} {previous}(Y), "
                     f"bond(X,Y,B), {bond_literal}. [activation=tanh]")
        lines.append(f"l{k}_embed / 1 [activation=tanh]")
        previous = f"l{k}_embed"
    lines += [f"{{1,{dim}}} predict :- l3_embed(X). [activation=tanh]", "predict / 0 [activation=tanh]"]
    return "\n".join(lines) + "\n"


class NeuraLogicEngine(Engine):
    """NeuraLogic's Java engine on a task built by :func:`attach`; always on the CPU.

    Laps: ``forward`` is ``model.test`` over all samples, ``epoch`` one training epoch
    (``model.train``: forward, backward and update of every sample; NeuraLogic does
    not expose them separately). The training step of this engine is the epoch.
    """

    kind = "neuralogic"

    def __init__(self, name: str = "neuralogic"):
        super().__init__(name)

    def build(self, task, device, dtype) -> dict:
        if task.source != "neuralogic":
            raise Skipped("NeuraLogic runs on the [NeuraLogic] variant of a task")
        if task.neuralogic is None:
            raise Skipped("; ".join(task.notes) or "no NeuraLogic model for this task")
        self.nl = task.neuralogic
        self.device_note = "cpu (Java)" if str(device) != "cpu" else None
        return {"build_s": self.nl.build_s, "rss_growth_bytes": self.nl.rss_growth_bytes,
                "model": self.nl.description, "settings": "NeuraLogic defaults (iso compression, chain pruning), "
                                                          "Adam lr 1e-3, MSE, full batch"}

    def outputs(self) -> np.ndarray:
        return self.nl.outputs()

    def iteration(self, watch, probe) -> None:
        self.nl.model.test(self.nl.built)
        watch.lap("forward")
        probe.sample()
        watch.resume()
        self.nl.model.train(self.nl.built, epochs=1)
        watch.lap("epoch")

    def close(self) -> None:
        self.__dict__.pop("nl", None)
