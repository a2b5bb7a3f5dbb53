"""Knowledge graphs (issue 27): the loader, its errors, filtered ranking and the synthetic generators."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neurovec.datasets import kg as kgmod
from neurovec.datasets.kg import KGDownloadError, KGFormatError, TripleFilter, load_kg, ranking_metrics
from neurovec.datasets.link_prediction import corrupt


# -- the real datasets ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, entities, relations, sizes", [
    ("kinships", 104, 25, (8544, 1068, 1074)), ("umls", 135, 46, (5216, 652, 661))])
def test_load_real(kg_dir, name, entities, relations, sizes):
    graph = load_kg(name, data_dir=kg_dir)
    assert (graph.n_entities, graph.n_relations) == (entities, relations)
    assert (len(graph.train), len(graph.valid), len(graph.test)) == sizes
    assert list(graph.entities) == sorted(graph.entities) and list(graph.relations) == sorted(graph.relations)
    # Every triple reads back as its line of the file.
    for split in ("train", "test"):
        lines = (kg_dir / name / f"{split}.txt").read_text().splitlines()
        rows = graph.split(split)
        for k in (0, len(lines) // 2, len(lines) - 1):
            h, r, t = rows[k]
            assert lines[k].split("\t") == [graph.entities[h], graph.relations[r], graph.entities[t]]
    assert graph.where("test", 4) == f"{kg_dir / name / 'test.txt'}, line 5"
    edge_index, edge_type = graph.message_edges()
    assert edge_index.shape == (2, 2 * sizes[0]) and edge_type.max() == 2 * relations - 1
    np.testing.assert_array_equal(edge_index[:, sizes[0]:], edge_index[::-1, :sizes[0]])


def test_fixed_relation_vocabulary(kg_dir):
    graph = load_kg("kinships", data_dir=kg_dir)
    same = load_kg("kinships", data_dir=kg_dir, relations=graph.relations[::-1])
    assert list(same.relations) == list(graph.relations[::-1])
    np.testing.assert_array_equal(same.relations[same.train[:, 1]], graph.relations[graph.train[:, 1]])
    with pytest.raises(KGFormatError, match=r"train\.txt, line \d+: relation 'term\d+' is not one of the "
                                            r"template's 24 relations"):
        load_kg("kinships", data_dir=kg_dir, relations=graph.relations[1:])


# -- bad input ----------------------------------------------------------------------------------------------------
def _write(folder, train="a\tr\tb\nb\ts\tc\n", valid="a\tr\tc\n", test="c\ts\ta\n"):
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"{split}.txt").write_text(text)
    return folder


def test_small_folder(tmp_path):
    graph = load_kg("tiny", data_dir=_write(tmp_path / "tiny").parent)
    assert list(graph.entities) == ["a", "b", "c"] and list(graph.relations) == ["r", "s"]
    np.testing.assert_array_equal(graph.train, [[0, 0, 1], [1, 1, 2]])
    np.testing.assert_array_equal(graph.test, [[2, 1, 0]])


@pytest.mark.parametrize("files, message", [
    (dict(train="a\tr\tb\nb\ts\n"), r"tiny/train\.txt, line 2: expected 3 tab-separated fields \(head, relation, "
                                    r"tail\), got 2"),
    (dict(train="a\tr\tb\nb s c\n"), r"tiny/train\.txt, line 2: expected 3 tab-separated fields"),
    (dict(valid="a\tr\tb\n\n"), r"tiny/valid\.txt, line 2: expected 3 tab-separated fields .* got 1"),
    (dict(test="a\t\tb\n"), r"tiny/test\.txt, line 1: a field is empty"),
    (dict(train="a\tr\tb\nb\ts\tc"), r"tiny/train\.txt, line 2: the last line has no line break"),
    (dict(test="c\ts\ta\nc\ts\tzed\n"), r"tiny/test\.txt, line 2: entity 'zed' does not occur in train\.txt"),
    (dict(valid="a\tq\tc\n"), r"tiny/valid\.txt, line 1: relation 'q' does not occur in train\.txt"),
    (dict(train=""), r"tiny/train\.txt has no triples"),
])
def test_bad_files_name_file_and_line(tmp_path, files, message):
    folder = _write(tmp_path / "tiny", **files)
    with pytest.raises(KGFormatError, match=message):
        load_kg("tiny", data_dir=folder.parent)


def test_missing_folder_and_offline_download(tmp_path, monkeypatch):
    with pytest.raises(KGFormatError, match="data_dir .* does not exist"):
        load_kg("kinships", data_dir=tmp_path / "nowhere")
    with pytest.raises(KGFormatError, match="has no train.txt"):
        load_kg("kinships", data_dir=tmp_path)
    monkeypatch.delenv("NEUROVEC_DATA", raising=False)
    monkeypatch.setattr(kgmod, "DEFAULT_CACHE", tmp_path / "cache")
    with pytest.raises(KGFormatError, match="download=False"):
        load_kg("kinships", download=False)
    with pytest.raises(KGFormatError, match="knows no download"):
        load_kg("fb15k-237-mine")
    # A real (refused) connection: port 9 on the loopback, nothing listens there.
    monkeypatch.setitem(kgmod.KG_URLS, "kinships", "http://127.0.0.1:9/{split}.txt")
    with pytest.raises(KGDownloadError, match=r"could not download .* offline\? Put train\.txt") as error:
        load_kg("kinships")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "cache" / "kinships").exists()


def test_environment_variable_is_searched(kg_dir, monkeypatch):
    monkeypatch.setenv("NEUROVEC_DATA", str(kg_dir.parent))
    assert load_kg("umls").n_entities == 135


# -- filtered ranking ---------------------------------------------------------------------------------------------
def _brute_ranks(scores_t, scores_h, triples, known, ties):
    """Rank by the definition, one triple and one candidate at a time."""
    known = {tuple(t) for t in known.tolist()}
    ranks = []
    for side, scores in (("tail", scores_t), ("head", scores_h)):
        for b, (h, r, t) in enumerate(triples.tolist()):
            target = t if side == "tail" else h
            true = scores[b, target]
            greater = equal = 0
            for e in range(scores.shape[1]):
                if e == target or ((h, r, e) if side == "tail" else (e, r, t)) in known:
                    continue
                greater += scores[b, e] > true
                equal += scores[b, e] == true
            ranks.append({"optimistic": 1 + greater, "pessimistic": 1 + greater + equal,
                          "realistic": 1 + greater + equal / 2}[ties])
    return np.array(ranks, dtype=np.float64)


@pytest.mark.parametrize("ties", ["realistic", "optimistic", "pessimistic"])
def test_filtered_ranks_match_the_definition(ties):
    graph = kgmod.synthetic_kg(30, 4, 600, seed=3)
    rng = np.random.default_rng(0)
    n = graph.n_entities
    # Scores rounded to a few values: many ties, so every tie rule is exercised.
    table = torch.tensor(rng.integers(0, 4, size=(n, graph.n_relations, n)).astype(np.float64))
    tails = lambda h, r: table[h, r, :]   # noqa: E731
    heads = lambda r, t: table[:, r, t].T  # noqa: E731
    known = graph.known_triples()
    filt = TripleFilter(known, n, graph.n_relations)
    tail_ranks, head_ranks = kgmod.rank_triples(tails, heads, graph.test, filt, batch_size=7, ties=ties)
    expected = _brute_ranks(table[graph.test[:, 0], graph.test[:, 1], :].numpy(),
                            table[:, graph.test[:, 1], graph.test[:, 2]].T.numpy(), graph.test, known, ties)
    np.testing.assert_array_equal(torch.cat([tail_ranks, head_ranks]).numpy(), expected)
    # Raw ranks: nothing filtered.
    raw_t, raw_h = kgmod.rank_triples(tails, heads, graph.test, None, ties=ties)
    expected_raw = _brute_ranks(table[graph.test[:, 0], graph.test[:, 1], :].numpy(),
                                table[:, graph.test[:, 1], graph.test[:, 2]].T.numpy(), graph.test,
                                np.zeros((0, 3), np.int64), ties)
    np.testing.assert_array_equal(torch.cat([raw_t, raw_h]).numpy(), expected_raw)
    metrics = ranking_metrics(tails, heads, graph.test, filt, ties=ties)
    assert metrics["mrr"] == pytest.approx(np.mean(1 / expected))
    assert metrics["hits@3"] == pytest.approx(np.mean(expected <= 3))


def test_perfect_scores_rank_first():
    graph = kgmod.synthetic_kg(20, 3, 200, seed=1)
    known = graph.known_triples()
    table = torch.zeros(20, 3, 20, dtype=torch.float64)
    table[known[:, 0], known[:, 1], known[:, 2]] = 1.0  # every true triple scores 1, the rest 0
    metrics = ranking_metrics(lambda h, r: table[h, r], lambda r, t: table[:, r, t].T, graph.test,
                              TripleFilter(known, 20, 3))
    assert metrics == {"mrr": 1.0, "hits@1": 1.0, "hits@3": 1.0, "hits@10": 1.0}


# -- synthetic data and negatives ---------------------------------------------------------------------------------
def test_synthetic_kg_is_seeded_distinct_and_covered():
    a = kgmod.synthetic_kg(200, 7, 3000, seed=5)
    b = kgmod.synthetic_kg(200, 7, 3000, seed=5)
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.test, b.test)
    every = a.known_triples()
    assert len(every) == 3000 and np.unique(every, axis=0).shape[0] == 3000
    for rows in (a.valid, a.test):
        assert np.isin(rows[:, [0, 2]], a.train[:, [0, 2]]).all() and np.isin(rows[:, 1], a.train[:, 1]).all()
    assert not np.array_equal(kgmod.synthetic_kg(200, 7, 3000, seed=6).train, a.train)


def test_synthetic_hetero():
    g = kgmod.synthetic_hetero(500, 4000, 5, n_features=3, n_classes=3, seed=2)
    assert g.x.shape == (500, 3) and g.edge_index.shape == (2, 4000) and g.edge_type.max() < 5
    assert np.bincount(g.labels, minlength=3).min() > 50  # the planted labels use every class
    assert np.union1d(g.train_nodes, g.test_nodes).size == 500
    np.testing.assert_array_equal(g.labels, kgmod.synthetic_hetero(500, 4000, 5, n_features=3, n_classes=3,
                                                                   seed=2).labels)


def test_corrupt_changes_one_side():
    triples = torch.tensor(kgmod.synthetic_kg(50, 3, 400, seed=0).train)
    negatives = corrupt(triples, 50, 3, torch.Generator().manual_seed(1))
    assert negatives.shape == (3 * len(triples), 3)
    same = negatives == triples.repeat(3, 1)
    assert same[:, 1].all() and (same[:, 0] | same[:, 2]).all()
    assert (~same[:, 0]).any() and (~same[:, 2]).any()
    again = corrupt(triples, 50, 3, torch.Generator().manual_seed(1))
    assert torch.equal(negatives, again)
