"""Knowledge graphs: triples ``head relation tail``, their vocabularies, and filtered ranking evaluation.

A knowledge graph ``NAME`` is a folder of three tab-separated text files, ``train.txt``,
``valid.txt`` and ``test.txt``, one triple ``head<TAB>relation<TAB>tail`` per line (the
layout of Kinship, UMLS and Nations as the field distributes them)::

    kg = load_kg("kinships", data_dir="../shared/data/kg")   # or $NEUROVEC_DATA; else downloaded
    kg.train                       # (8544, 3) int64 rows (head, relation, tail)
    kg.entities[kg.train[0, 0]]    # 'person100'
    edge_index, edge_type = kg.message_edges()        # the training graph, with inverse relations

**Vocabularies** come from the training split: entities and relations in sorted order of
their names. Every entity and relation of ``valid.txt`` and ``test.txt`` must occur in
``train.txt`` (a model has no embedding for anything else): one that does not is an error
naming the file and the line. ``load_kg(..., relations=[...])`` fixes the relation
vocabulary instead (that of a trained template): a relation outside it is an error naming
the file and line. A triple listed twice is kept twice (as message edges it counts twice,
as in PyG).

**Errors** (:class:`KGFormatError`) name the file and the 1-based line: a line that is not
three non-empty tab-separated fields, a file that does not end with a line break (a
truncated download), an unknown entity or relation.

**Where the folder is looked for**: the ``data_dir`` argument if given (and nowhere else),
otherwise ``$NEUROVEC_DATA``, then the cache ``~/.cache/neurovec/kg``; inside each,
``NAME/`` and ``kg/NAME/``. Only when no ``data_dir`` is given and nothing is found are the
files downloaded (``kinships``, ``umls`` and ``nations``, from PyKEEN's repository, which
ships these splits) into the cache; offline that fails with one line saying so.

**Filtered ranking** (:func:`ranking_metrics`), as the field computes it (Bordes et al.,
2013): every test triple ``(h, r, t)`` is corrupted on both sides; the true tail's score
is ranked among the scores of all entities as tails of ``(h, r, ?)``, leaving out every
*other* tail ``t'`` with ``(h, r, t')`` a known true triple (train, valid and test), and the
same for heads. MRR is the mean of ``1/rank`` over both sides of every triple, Hits@k the
fraction of ranks ``<= k``. Ties take the mean of the optimistic and the pessimistic rank
(``ties="realistic"``; Sun et al., 2020 showed that ranking a tie first inflates some
published numbers); ``"optimistic"`` and ``"pessimistic"`` are the two extremes. All of it is
whole-tensor code: one ``(batch, n_entities)`` score matrix per side and batch, the filter a
boolean mask built from sorted triple keys with two binary searches.

:func:`synthetic_kg` makes seeded random knowledge graphs of any size;
:func:`synthetic_hetero` makes a heterogeneous node-classification graph (features, typed
edges, planted labels) for RGCN entity classification at scale.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ._common import DatasetError, find_folder, searched_roots

__all__ = ["KnowledgeGraph", "KGFormatError", "KGDownloadError", "load_kg", "find_kg", "read_kg_folder",
           "read_triples", "TripleFilter", "ranking_metrics", "rank_triples", "synthetic_kg", "HeteroGraph",
           "synthetic_hetero", "SPLITS", "KG_URLS", "DEFAULT_CACHE"]

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
DEFAULT_CACHE = Path.home() / ".cache" / "neurovec" / "kg"
_PYKEEN = "https://raw.githubusercontent.com/pykeen/pykeen/master/src/pykeen/datasets"
#: Where the known datasets are downloaded from: ``{split}`` is train, valid or test.
KG_URLS = {"kinships": f"{_PYKEEN}/kinships/{{split}}.txt", "umls": f"{_PYKEEN}/umls/{{split}}.txt",
           "nations": f"{_PYKEEN}/nations/{{split}}.txt"}
DOWNLOAD_TIMEOUT_S = 60


class KGFormatError(DatasetError):
    """A knowledge-graph file is missing or malformed; the message names the file and line."""


class KGDownloadError(KGFormatError):
    """A knowledge graph is not available locally and could not be downloaded."""


@dataclass(frozen=True, eq=False)
class KnowledgeGraph:
    """Triples as ``(n, 3)`` int64 arrays of ``(head, relation, tail)`` ids into ``entities`` / ``relations``.

    ``sources[split]`` is ``(path, lines)``: the file each split was read from and the 1-based
    line of every triple (``None`` for generated graphs), so later checks can name them.
    """

    name: str
    entities: np.ndarray
    relations: np.ndarray
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    sources: dict = field(default_factory=dict, repr=False)

    @property
    def n_entities(self) -> int:
        return int(self.entities.size)

    @property
    def n_relations(self) -> int:
        return int(self.relations.size)

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise DatasetError(f"unknown split {name!r} (expected one of {SPLITS})")
        return getattr(self, name)

    def known_triples(self) -> np.ndarray:
        """Every true triple the graph lists (train, valid, test): what filtered ranking filters out."""
        return np.concatenate([self.train, self.valid, self.test])

    def message_edges(self, inverse: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The training triples as a typed graph: ``edge_index`` (2, E) from head to tail and ``edge_type``.

        With ``inverse`` (the RGCN convention) every triple also gives the edge tail -> head of
        type ``relation + n_relations``: ``2 n_relations`` edge types in all.
        """
        h, r, t = self.train.T
        if not inverse:
            return np.stack([h, t]), r.copy()
        return (np.stack([np.concatenate([h, t]), np.concatenate([t, h])]),
                np.concatenate([r, r + self.n_relations]))

    def where(self, split: str, row: int) -> str:
        """``"path, line N"`` of triple ``row`` of ``split`` (or ``"split row N"`` for a generated graph)."""
        path, lines = self.sources.get(split, (None, None))
        if path is None:
            return f"{self.name} {split} triple {row}"
        return f"{path}, line {int(lines[row])}"

    def __repr__(self) -> str:
        return (f"KnowledgeGraph({self.name!r}, {self.n_entities} entities, {self.n_relations} relations, "
                f"{len(self.train)}/{len(self.valid)}/{len(self.test)} train/valid/test triples)")


# -- locating and downloading ----------------------------------------------------------------

def _candidates(root: Path, name: str) -> list[Path]:
    return [root / name, root / "kg" / name]


def find_kg(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``name``'s ``train.txt``, or ``None``; ``data_dir`` alone, else ``$NEUROVEC_DATA`` and the cache."""
    return find_folder(data_dir, DEFAULT_CACHE, lambda root: _candidates(root, name), "train.txt")


def load_kg(name: str, data_dir: str | os.PathLike | None = None, download: bool = True,
            relations: Sequence[str] | None = None) -> KnowledgeGraph:
    """Load knowledge graph ``name`` (``"kinships"``, ``"umls"``, ``"nations"`` or any folder name).

    With ``data_dir`` the folder must be there (a mistyped folder is an error, never a download
    into it). ``relations``: the relation vocabulary to use (a trained template's), in order.
    """
    folder = find_kg(name, data_dir)
    if folder is not None:
        return read_kg_folder(folder, name, relations)
    if data_dir is not None:
        where = Path(data_dir).expanduser()
        looked = ", ".join(str(p) for p in _candidates(where, name))
        problem = "does not exist" if not where.exists() else "has no train.txt there"
        raise KGFormatError(f"knowledge graph {name!r} not found: data_dir {str(where)!r} {problem} (looked in "
                            f"{looked}); leave data_dir out to use $NEUROVEC_DATA or download it into "
                            f"{DEFAULT_CACHE}")
    searched = searched_roots(DEFAULT_CACHE)
    if not download:
        raise KGFormatError(f"knowledge graph {name!r} not found (looked in {searched}) and download=False")
    if name not in KG_URLS:
        raise KGFormatError(f"knowledge graph {name!r} not found (looked in {searched}), and neurovec knows no "
                            f"download for it (known: {', '.join(KG_URLS)}); put train.txt, valid.txt and "
                            f"test.txt in a folder {name}/ and pass its parent as data_dir")
    logger.warning("knowledge graph %r not found in %s: downloading it into %s", name, searched, DEFAULT_CACHE)
    return read_kg_folder(_download(name, DEFAULT_CACHE), name, relations)


def _download(name: str, cache: Path) -> Path:
    """Fetch the three splits of ``name`` into ``cache/name`` (all or nothing)."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        fetched = Path(tmp) / name
        fetched.mkdir()
        for split in SPLITS:
            url = KG_URLS[name].format(split=split)
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, \
                        open(fetched / f"{split}.txt", "wb") as out:
                    shutil.copyfileobj(response, out)
            except urllib.error.HTTPError as error:
                raise KGDownloadError(f"could not download knowledge graph {name!r} from {url}: HTTP "
                                      f"{error.code} {error.reason}") from None
            except (urllib.error.URLError, OSError) as error:
                reason = getattr(error, "reason", error)
                raise KGDownloadError(f"could not download knowledge graph {name!r} from {url} ({reason}); "
                                      f"offline? Put train.txt, valid.txt and test.txt in {cache / name} or "
                                      "pass data_dir") from None
        target = cache / name
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(fetched), str(target))
    logger.warning("knowledge graph %r downloaded into %s", name, target)
    return target


# -- reading ---------------------------------------------------------------------------------

def read_triples(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The triples of one file as strings: ``(n, 3)`` array of ``(head, relation, tail)`` and each one's line.

    Lines are ``head<TAB>relation<TAB>tail`` (a trailing ``\\r`` is dropped); any other line is
    an error naming the file and line. The whole file is split at once, not line by line.
    """
    path = Path(path)
    if not path.is_file():
        raise KGFormatError(f"missing file {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise KGFormatError(f"{path}: not a UTF-8 text file ({error})") from None
    if not text:
        return np.zeros((0, 3), dtype=str), np.zeros(0, np.int64)
    if not text.endswith("\n"):
        raise KGFormatError(f"{path}, line {text.count(chr(10)) + 1}: the last line has no line break, so the "
                            "file looks truncated (a cut-off line would be read as a wrong triple); if it is "
                            "complete, end it with a newline")
    lines = np.array(text[:-1].replace("\r\n", "\n").split("\n"))
    tabs = np.char.count(lines, "\t")
    fields = text[:-1].replace("\r\n", "\n").replace("\n", "\t").split("\t")
    bad = np.flatnonzero(tabs != 2)
    if not bad.size:
        triples = np.array(fields).reshape(-1, 3)
        empty = np.flatnonzero((np.char.str_len(triples) == 0).any(axis=1) |
                               (np.char.str_len(np.char.strip(triples)) != np.char.str_len(triples)).any(axis=1))
        if not empty.size:
            return triples, np.arange(1, len(lines) + 1, dtype=np.int64)
        bad = empty
    k = int(bad[0])
    parts = str(lines[k]).split("\t")
    if len(parts) != 3:
        problem = f"expected 3 tab-separated fields (head, relation, tail), got {len(parts)}"
    else:
        problem = "a field is empty or has spaces around it"
    raise KGFormatError(f"{path}, line {k + 1}: {problem}: {str(lines[k])!r:.100}")


def read_kg_folder(folder: str | os.PathLike, name: str | None = None,
                   relations: Sequence[str] | None = None) -> KnowledgeGraph:
    """Read ``train.txt``, ``valid.txt`` and ``test.txt`` of ``folder`` (see the module doc)."""
    folder = Path(folder)
    name = name or folder.name
    raw = {split: read_triples(folder / f"{split}.txt") for split in SPLITS}
    train = raw["train"][0]
    if len(train) == 0:
        raise KGFormatError(f"{folder / 'train.txt'} has no triples")
    entities = np.unique(np.concatenate([train[:, 0], train[:, 2]]))
    if relations is None:
        relation_names = np.unique(train[:, 1])
    else:
        relation_names = np.asarray(list(relations), dtype=str)
        if np.unique(relation_names).size != relation_names.size:
            raise KGFormatError("the given relation vocabulary lists a relation twice")
    order = np.argsort(relation_names, kind="stable")
    ids, sources = {}, {}
    for split in SPLITS:
        triples, lines = raw[split]
        path = folder / f"{split}.txt"
        heads = _lookup(entities, np.arange(entities.size), triples[:, 0], path, lines, split, "entity")
        tails = _lookup(entities, np.arange(entities.size), triples[:, 2], path, lines, split, "entity")
        rels = _lookup(relation_names[order], order, triples[:, 1], path, lines, split, "relation",
                       given=relations is not None)
        ids[split] = np.stack([heads, rels, tails], axis=1).astype(np.int64)
        sources[split] = (path, lines)
    return KnowledgeGraph(name, entities, relation_names, ids["train"], ids["valid"], ids["test"], sources)


def _lookup(sorted_names: np.ndarray, ids: np.ndarray, names: np.ndarray, path: Path, lines: np.ndarray,
            split: str, what: str, given: bool = False) -> np.ndarray:
    """Ids of ``names`` in a sorted vocabulary (binary search); an unknown name names its file and line."""
    if names.size == 0:
        return np.zeros(0, np.int64)
    position = np.minimum(np.searchsorted(sorted_names, names), sorted_names.size - 1)
    unknown = np.flatnonzero(sorted_names[position] != names)
    if unknown.size:
        k = int(unknown[0])
        if given:
            why = f"is not one of the template's {sorted_names.size} relations"
        else:
            why = f"does not occur in train.txt (every {what} of valid.txt and test.txt must be in the training " \
                  "split: a model has no embedding for it)"
        raise KGFormatError(f"{path}, line {int(lines[k])}: {what} {str(names[k])!r} {why}")
    return ids[position]


# -- filtered ranking ------------------------------------------------------------------------

class TripleFilter:
    """The known true triples as sorted int64 keys, to mask them out of a batch's score matrix.

    ``tail_mask(h, r)`` is the ``(B, n_entities)`` boolean mask of the tails ``t'`` with
    ``(h, r, t')`` known; ``head_mask(r, t)`` likewise for heads. Built with one sort; each mask
    with two binary searches per row and one scatter, no loop over triples.
    """

    def __init__(self, known: np.ndarray, n_entities: int, n_relations: int):
        known = np.asarray(known, dtype=np.int64).reshape(-1, 3)
        self.n_entities, self.n_relations = int(n_entities), int(n_relations)
        if known.size and (known.min() < 0 or known[:, [0, 2]].max() >= n_entities
                           or known[:, 1].max() >= n_relations):
            raise DatasetError("known triples reference entities or relations outside the vocabulary")
        h, r, t = (torch.from_numpy(known[:, k].copy()) for k in range(3))
        self.tail_keys = torch.sort(self._key(h, r) * n_entities + t).values
        self.head_keys = torch.sort(self._key(t, r) * n_entities + h).values

    def _key(self, entity: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        return entity * self.n_relations + relation

    def _mask(self, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        n = self.n_entities
        low = torch.searchsorted(keys, query * n)
        high = torch.searchsorted(keys, (query + 1) * n)
        counts = high - low
        rows = torch.repeat_interleave(torch.arange(query.numel()), counts)
        starts = torch.repeat_interleave(low - torch.cumsum(counts, 0) + counts, counts)
        columns = keys[starts + torch.arange(rows.numel())] % n
        mask = torch.zeros(query.numel(), n, dtype=torch.bool)
        mask[rows, columns] = True
        return mask

    def tail_mask(self, heads: torch.Tensor, relations: torch.Tensor) -> torch.Tensor:
        return self._mask(self.tail_keys, self._key(heads.cpu().long(), relations.cpu().long()))

    def head_mask(self, relations: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        return self._mask(self.head_keys, self._key(tails.cpu().long(), relations.cpu().long()))


TIES = ("realistic", "optimistic", "pessimistic")


def _ranks(scores: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, ties: str) -> torch.Tensor:
    """Filtered rank of ``target`` in each row of ``scores`` (``mask``: known triples, left out but the target)."""
    rows = torch.arange(scores.shape[0], device=scores.device)
    true = scores[rows, target].unsqueeze(1)
    if torch.isnan(true).any():
        raise DatasetError("a score of a true triple is NaN")
    mask = mask.to(scores.device)
    mask[rows, target] = False
    others = mask.logical_not()
    others[rows, target] = False
    greater = ((scores > true) & others).sum(1).to(torch.float64)
    equal = ((scores == true) & others).sum(1).to(torch.float64)
    if ties == "optimistic":
        return 1 + greater
    if ties == "pessimistic":
        return 1 + greater + equal
    return 1 + greater + equal / 2


def rank_triples(score_tails: Callable, score_heads: Callable, triples, triple_filter: TripleFilter | None,
                 batch_size: int = 1024, ties: str = "realistic") -> tuple[torch.Tensor, torch.Tensor]:
    """The filtered ranks of the true tail and the true head of every triple: ``(tail_ranks, head_ranks)``.

    ``score_tails(h, r)`` returns the ``(B, n_entities)`` scores of every entity as the tail of
    ``(h[b], r[b], ?)``; ``score_heads(r, t)`` those of every entity as the head of ``(?, r[b], t[b])``.
    ``triple_filter`` None gives the raw (unfiltered) ranks.
    """
    if ties not in TIES:
        raise DatasetError(f"unknown ties {ties!r} (expected one of {TIES})")
    triples = torch.as_tensor(np.asarray(triples), dtype=torch.long).reshape(-1, 3)
    tail_ranks, head_ranks = [], []
    with torch.no_grad():
        for start in range(0, triples.shape[0], batch_size):  # a loop over batches, not triples
            h, r, t = triples[start:start + batch_size].T
            tails = score_tails(h, r)
            heads = score_heads(r, t)
            n = tails.shape[1]
            no_mask = torch.zeros(h.numel(), n, dtype=torch.bool)
            tail_ranks.append(_ranks(tails, t.to(tails.device),
                                     triple_filter.tail_mask(h, r) if triple_filter else no_mask, ties))
            head_ranks.append(_ranks(heads, h.to(heads.device),
                                     triple_filter.head_mask(r, t) if triple_filter else no_mask.clone(), ties))
    if not tail_ranks:
        raise DatasetError("no triples to rank")
    return torch.cat(tail_ranks).cpu(), torch.cat(head_ranks).cpu()


def ranking_metrics(score_tails: Callable, score_heads: Callable, triples, triple_filter: TripleFilter | None,
                    hits=(1, 3, 10), batch_size: int = 1024, ties: str = "realistic") -> dict[str, float]:
    """Filtered MRR and Hits@k over both sides of every triple (see the module doc): ``{"mrr": ..., "hits@10": ...}``."""
    tail_ranks, head_ranks = rank_triples(score_tails, score_heads, triples, triple_filter, batch_size, ties)
    ranks = torch.cat([tail_ranks, head_ranks])
    result = {"mrr": float((1.0 / ranks).mean())}
    for k in hits:
        result[f"hits@{k}"] = float((ranks <= k).to(torch.float64).mean())
    return result


# -- synthetic data --------------------------------------------------------------------------

def synthetic_kg(n_entities: int = 1000, n_relations: int = 10, n_triples: int = 10_000, seed: int = 0,
                 valid_fraction: float = 0.05, test_fraction: float = 0.05, name: str | None = None) -> KnowledgeGraph:
    """A seeded random knowledge graph: ``n_triples`` distinct triples, split at random.

    Relations follow a Zipf-like frequency (real graphs have a few frequent relations and a
    long tail). A valid or test triple whose entity or relation the training split lacks is
    moved to the training split, so the vocabularies are the training split's.
    """
    if min(n_entities, n_relations, n_triples) < 1:
        raise DatasetError("synthetic_kg needs at least one entity, relation and triple")
    space = n_entities * n_relations * n_entities
    if n_triples > space // 2:
        raise DatasetError(f"{n_triples} distinct triples do not fit comfortably among the {space} possible ones")
    rng = np.random.default_rng(seed)
    weight = 1.0 / np.arange(1, n_relations + 1)
    keys = np.zeros(0, np.int64)
    while keys.size < n_triples:  # draw, drop repeats, top up: a few rounds at most
        draw = 2 * (n_triples - keys.size) + 16
        h = rng.integers(0, n_entities, draw)
        t = rng.integers(0, n_entities, draw)
        r = rng.choice(n_relations, size=draw, p=weight / weight.sum())
        new = (h * n_relations + r) * n_entities + t
        keys = np.concatenate([keys, new[np.sort(np.unique(new, return_index=True)[1])]])
        keys = keys[np.sort(np.unique(keys, return_index=True)[1])][:n_triples]
    triples = np.stack([keys // (n_relations * n_entities), keys // n_entities % n_relations, keys % n_entities], 1)
    split = rng.random(n_triples)
    is_test = split < test_fraction
    is_valid = ~is_test & (split < test_fraction + valid_fraction)
    train = triples[~is_test & ~is_valid]
    seen_entity = np.zeros(n_entities, bool)
    seen_entity[train[:, [0, 2]].ravel()] = True
    seen_relation = np.zeros(n_relations, bool)
    seen_relation[train[:, 1]] = True
    covered = seen_entity[triples[:, 0]] & seen_entity[triples[:, 2]] & seen_relation[triples[:, 1]]
    is_test &= covered
    is_valid &= covered
    train = triples[~is_test & ~is_valid]
    # Renumber to the training split's vocabulary (sorted names, as load_kg numbers them).
    entity_ids = np.unique(train[:, [0, 2]])
    relation_ids = np.unique(train[:, 1])
    width_e, width_r = len(str(n_entities - 1)), len(str(n_relations - 1))
    entities = np.array([f"e{i:0{width_e}d}" for i in entity_ids])
    relations = np.array([f"r{i:0{width_r}d}" for i in relation_ids])

    def renumber(rows):
        return np.stack([np.searchsorted(entity_ids, rows[:, 0]), np.searchsorted(relation_ids, rows[:, 1]),
                         np.searchsorted(entity_ids, rows[:, 2])], 1).astype(np.int64)

    return KnowledgeGraph(name or f"synthetic-{n_entities}x{n_relations}x{n_triples}-seed{seed}", entities, relations,
                          renumber(train), renumber(triples[is_valid]), renumber(triples[is_test]))


@dataclass(frozen=True, eq=False)
class HeteroGraph:
    """A node-classification graph with typed edges: ``x`` (n, f), ``edge_index`` (2, E), ``edge_type`` (E,),
    ``labels`` (n,), and a train/test split of the nodes (``train_nodes``, ``test_nodes``)."""

    x: np.ndarray
    edge_index: np.ndarray
    edge_type: np.ndarray
    labels: np.ndarray
    n_relations: int
    n_classes: int
    train_nodes: np.ndarray
    test_nodes: np.ndarray

    @property
    def n_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edge_type.size)

    def __repr__(self) -> str:
        return (f"HeteroGraph({self.n_nodes} nodes, {self.n_edges} edges, {self.n_relations} relation types, "
                f"{self.x.shape[1]} features, {self.n_classes} classes)")


def synthetic_hetero(n_nodes: int = 100_000, n_edges: int = 1_000_000, n_relations: int = 10, n_features: int = 16,
                     n_classes: int = 4, seed: int = 0, train_fraction: float = 0.8) -> HeteroGraph:
    """A seeded heterogeneous graph whose labels depend on the relation types (so an RGCN can learn them).

    Edges join uniformly random nodes, with uniformly random types. A node's label is the
    arg-max of ``x_i A + sum_r mean_{j in N_r(i)} x_j B_r`` for random ``A``, ``B_r``: the
    per-relation means an RGCN layer computes, with a weight per relation.
    """
    if min(n_nodes, n_edges, n_relations, n_features, n_classes) < 1:
        raise DatasetError("synthetic_hetero needs positive sizes")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_nodes, n_features))
    src = rng.integers(0, n_nodes, n_edges)
    dst = rng.integers(0, n_nodes, n_edges)
    edge_type = rng.integers(0, n_relations, n_edges)
    signal = x @ rng.normal(size=(n_features, n_classes))
    mixing = rng.normal(size=(n_relations, n_features, n_classes))
    pair = dst * n_relations + edge_type
    counts = np.bincount(pair, minlength=n_nodes * n_relations)
    chunk = 1 << 16  # edges per step: the (edges, features, classes) product stays small
    for start in range(0, n_edges, chunk):
        e = slice(start, start + chunk)
        message = np.einsum("ef,efc->ec", x[src[e]], mixing[edge_type[e]]) / counts[pair[e]][:, None]
        np.add.at(signal, dst[e], message)
    labels = signal.argmax(1).astype(np.int64)
    order = rng.permutation(n_nodes)
    cut = int(round(train_fraction * n_nodes))
    return HeteroGraph(x, np.stack([src, dst]).astype(np.int64), edge_type.astype(np.int64), labels, n_relations,
                       n_classes, np.sort(order[:cut]), np.sort(order[cut:]))
