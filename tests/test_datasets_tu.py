"""The TU loader: published statistics, folder layouts and malformed files."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from neurovec.datasets import TUFormatError, load_tu
from neurovec.datasets.tu import find_tu

# name: (graphs, nodes, directed edges, node label values, classes, attribute columns)
PUBLISHED = {
    "MUTAG": (188, 3371, 7442, 7, 2, None),
    "ENZYMES": (600, 19580, 74564, 3, 6, 18),
    "PROTEINS": (1113, 43471, 162088, 3, 2, 1),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_statistics(tu_dir, name):
    graphs, nodes, edges, labels, classes, attributes = PUBLISHED[name]
    ds = load_tu(name, tu_dir)
    assert (ds.n_graphs, ds.n_nodes, ds.n_edges) == (graphs, nodes, edges)
    assert ds.edge_index.shape == (2, edges) and ds.edge_index.dtype == np.int64
    assert ds.edge_index.min() == 0 and ds.edge_index.max() == nodes - 1
    assert ds.graph_of_node.shape == (nodes,) and ds.graph_labels.shape == (graphs,)
    assert ds.num_node_labels == labels and ds.num_classes == classes
    assert set(np.unique(ds.graph_labels)) == set(range(classes))
    features = ds.node_features()
    assert features.shape == (nodes, labels) and np.all(features.sum(1) == 1)
    if attributes is None:
        assert ds.node_attributes is None
    else:
        assert ds.node_attributes.shape == (nodes, attributes)
        assert ds.node_features(use_attributes=True).shape == (nodes, attributes + labels)
    # TU edges are symmetric: every (u, v) has its (v, u).
    forward = set(map(tuple, ds.edge_index.T.tolist()))
    assert all((v, u) in forward for u, v in forward)


def test_mutag_raw_labels(tu_dir):
    ds = load_tu("MUTAG", tu_dir)
    assert ds.label_values.tolist() == [-1.0, 1.0]
    assert int((ds.graph_labels == 1).sum()) == 125


def _copy(tu_dir, tmp_path, name="MUTAG", layout=""):
    folder = tmp_path / name / layout if layout else tmp_path / name
    shutil.copytree(tu_dir / name, folder)
    return folder


def test_pyg_raw_layout_and_env_var(tu_dir, tmp_path, monkeypatch):
    _copy(tu_dir, tmp_path, layout="raw")
    assert find_tu("MUTAG", tmp_path) == tmp_path / "MUTAG" / "raw"
    monkeypatch.setenv("NEUROVEC_DATA", str(tmp_path))
    assert load_tu("MUTAG").n_graphs == 188


def test_missing_dataset_without_download(tmp_path):
    with pytest.raises(TUFormatError, match="not found"):
        load_tu("MUTAG", tmp_path, download=False)


@pytest.mark.parametrize("file, content, message", [
    ("A", "1, 2\n2, x\n", r"MUTAG_A\.txt: malformed"),
    ("A", "1, 2, 3\n", "expected 2 comma-separated columns"),
    ("A", "1, 99999\n", r"MUTAG_A\.txt, line 1: node id out of range"),
    ("A", "1, 3000\n", r"MUTAG_A\.txt, line 1: edge joins nodes of different graphs"),
    ("graph_labels", "1\n-1\n", "graph_labels.txt has 2 lines, expected 188"),
    ("node_labels", "0\n", "node_labels.txt has 1 lines, expected 3371"),
    ("graph_indicator", "1\n1\n3\n", "graph 2 has no nodes"),
])
def test_malformed_files(tu_dir, tmp_path, file, content, message):
    folder = _copy(tu_dir, tmp_path)
    (folder / f"MUTAG_{file}.txt").write_text(content)
    with pytest.raises(TUFormatError, match=message):
        load_tu("MUTAG", tmp_path)


def test_missing_file(tu_dir, tmp_path):
    folder = _copy(tu_dir, tmp_path)
    (folder / "MUTAG_graph_labels.txt").unlink()
    with pytest.raises(TUFormatError, match="missing file .*MUTAG_graph_labels.txt"):
        load_tu("MUTAG", tmp_path)
