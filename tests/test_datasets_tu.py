"""The TU loader: published statistics, folder layouts and malformed files."""
from __future__ import annotations

import shutil
from pathlib import Path

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
    ("A", "1, 2\n2, x\n", r"MUTAG_A\.txt, line 2: 'x' is not a number"),
    ("A", "1, 2\n\n2, 1\n", r"MUTAG_A\.txt, line 2: is empty"),
    ("A", "1, 2\n2, 1, 3\n", r"MUTAG_A\.txt, line 2: expected 2 comma-separated values, got 3"),
    ("A", "1, 2\n2.5, 1\n", r"MUTAG_A\.txt, line 2: expected integers, got '2\.5, 1'"),
    ("graph_indicator", "1\n\n", r"MUTAG_graph_indicator\.txt, line 2: is empty"),
    ("A", "1, 99999\n", r"MUTAG_A\.txt, line 1: node id out of range"),
    ("A", "1, 3000\n", r"MUTAG_A\.txt, line 1: edge joins nodes of different graphs"),
    ("graph_labels", "1\n-1\n", "graph_labels.txt has 2 lines, expected 188"),
    ("node_labels", "0\n", "node_labels.txt has 1 lines, expected 3371"),
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


# -- label edge cases (see the module doc of neurovec.datasets.tu for the chosen behaviour) --

def _set_lines(folder, suffix, changes: dict[int, str]):
    """Replace 1-based lines of MUTAG_<suffix>.txt."""
    path = folder / f"MUTAG_{suffix}.txt"
    lines = path.read_text().split("\n")
    for line, text in changes.items():
        lines[line - 1] = text
    path.write_text("\n".join(lines))


def test_nan_graph_label_is_an_error_not_a_class(tu_dir, tmp_path):
    _set_lines(_copy(tu_dir, tmp_path), "graph_labels", {5: "nan"})
    with pytest.raises(TUFormatError, match=r"MUTAG_graph_labels\.txt, line 5: expected integers, got 'nan'"):
        load_tu("MUTAG", tmp_path)


def test_fractional_labels_are_errors_not_truncated(tu_dir, tmp_path):
    _set_lines(_copy(tu_dir, tmp_path), "node_labels", {17: "1.7"})
    with pytest.raises(TUFormatError, match=r"MUTAG_node_labels\.txt, line 17: expected integers, got '1\.7'"):
        load_tu("MUTAG", tmp_path)


def test_huge_node_label_is_refused_without_a_giant_allocation(tu_dir, tmp_path):
    import tracemalloc
    _set_lines(_copy(tu_dir, tmp_path), "node_labels", {17: "100000"})
    tracemalloc.start()
    try:
        with pytest.raises(TUFormatError, match=r"MUTAG_node_labels\.txt: labels range from 0 \(line \d+\) to 100000 "
                                                r"\(line 17\), so their one-hot encoding would be 100001 columns "
                                                r"wide, but only 8 distinct labels occur"):
            load_tu("MUTAG", tmp_path)
        assert tracemalloc.get_traced_memory()[1] < 50 * 2 ** 20
    finally:
        tracemalloc.stop()


def test_labels_with_a_gap_are_one_hot_over_their_range_as_pyg(tu_dir, tmp_path):
    """A label 20 among 0..6: 21 columns (PyG's encoding), within the sparse-label limit."""
    _set_lines(_copy(tu_dir, tmp_path), "node_labels", {17: "20"})
    ds = load_tu("MUTAG", tmp_path)
    assert ds.num_node_labels == 21 and ds.node_features()[16, 20] == 1.0


def test_negative_node_label_shifts_the_column_with_a_warning(tu_dir, tmp_path, caplog):
    _set_lines(_copy(tu_dir, tmp_path), "node_labels", {17: "-1"})
    with caplog.at_level("WARNING", logger="neurovec.datasets.tu"):
        ds = load_tu("MUTAG", tmp_path)
    assert "MUTAG_node_labels.txt: negative label -1 (line 17)" in caplog.text
    # As PyG: every label moves up by one, so the one-hot is one column wider.
    reference = load_tu("MUTAG", tu_dir)
    assert ds.num_node_labels == reference.num_node_labels + 1
    assert ds.node_labels[16, 0] == 0
    others = np.arange(ds.n_nodes) != 16
    np.testing.assert_array_equal(ds.node_labels[others, 0], reference.node_labels[others, 0] + 1)


def test_truncated_edge_file_names_the_partial_line(tu_dir, tmp_path):
    folder = _copy(tu_dir, tmp_path)
    path = folder / "MUTAG_A.txt"
    text = path.read_text()
    path.write_text(text[:-3])  # the last line "3369, 3371" cut to "3369, 33": a wrong edge
    with pytest.raises(TUFormatError, match=r"MUTAG_A\.txt, line 7442: the last line has no line break, so the "
                                            r"file looks truncated"):
        load_tu("MUTAG", tmp_path)


def test_copies_of_an_edge_with_different_labels_are_refused(tu_dir, tmp_path):
    folder = _copy(tu_dir, tmp_path)
    first_edge = (folder / "MUTAG_A.txt").read_text().split("\n")[0]
    with open(folder / "MUTAG_A.txt", "a") as handle:
        handle.write(first_edge + "\n")
    with open(folder / "MUTAG_edge_labels.txt", "a") as handle:
        handle.write("3\n")
    with pytest.raises(TUFormatError, match=r"MUTAG_edge_labels\.txt, lines 1 and 7443: edge \[2, 1\] is listed "
                                            r"twice in MUTAG_A\.txt with different values \(\[0\] and \[3\]\)"):
        load_tu("MUTAG", tmp_path)


def test_edge_labels_must_match_the_edge_file(tu_dir, tmp_path):
    _set_lines(_copy(tu_dir, tmp_path), "edge_labels", {7443: "1\n"})
    with pytest.raises(TUFormatError, match=r"MUTAG_edge_labels\.txt has 7443 lines, expected 7442 \(one per "
                                            r"line of MUTAG_A\.txt\)"):
        load_tu("MUTAG", tmp_path)


# -- where data is looked for, and downloads -------------------------------------------------------

@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to download fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("load_tu tried to download")
    monkeypatch.setattr("urllib.request.urlopen", refuse)


def test_mistyped_data_dir_is_an_error_not_a_download(tmp_path, no_network):
    typo = tmp_path / "shraed" / "tu"
    with pytest.raises(TUFormatError, match=r"TU dataset 'MUTAG' not found: data_dir '.*shraed/tu' does not exist"):
        load_tu("MUTAG", typo)
    assert not typo.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(TUFormatError, match=r"data_dir '.*empty' has no MUTAG_A\.txt \(looked in .*empty/MUTAG/raw"):
        load_tu("MUTAG", tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []


def test_download_offline_fails_with_one_clear_line(tmp_path, monkeypatch, caplog):
    from neurovec.datasets import tu
    monkeypatch.delenv("NEUROVEC_DATA", raising=False)
    monkeypatch.setattr(tu, "DEFAULT_CACHE", tmp_path / "cache")
    monkeypatch.setattr(tu, "TU_URL", "https://neurovec-test.invalid/tu")  # never resolves
    with caplog.at_level("WARNING", logger="neurovec.datasets.tu"):
        with pytest.raises(tu.TUDownloadError) as error:
            load_tu("MUTAG")
    message = str(error.value)
    assert "\n" not in message and error.value.__suppress_context__
    assert message.startswith("could not download TU dataset 'MUTAG' from https://neurovec-test.invalid/tu/MUTAG.zip")
    assert f"downloading it from https://neurovec-test.invalid/tu into {tmp_path / 'cache'}" in caplog.text
    assert not (tmp_path / "cache" / "MUTAG").exists()


def test_environment_folder_is_searched_before_the_cache(tu_dir, tmp_path, monkeypatch, no_network):
    from neurovec.datasets import tu
    monkeypatch.setattr(tu, "DEFAULT_CACHE", tmp_path / "cache")
    monkeypatch.setenv("NEUROVEC_DATA", str(tu_dir))
    assert load_tu("MUTAG").n_graphs == 188
    with pytest.raises(TUFormatError, match=r"not found \(looked in .*\): set NEUROVEC_DATA to the folder that holds "
                                            r"NOPE/ or tu/NOPE/.*or allow a download"):
        load_tu("NOPE", download=False)


def test_train_tu_reads_neurovec_data_and_never_downloads_unasked(tu_dir, tmp_path, monkeypatch, no_network):
    """examples/train_tu.py defaulted to ../shared/data/tu, relative to the working directory, and ignored
    $NEUROVEC_DATA; now the loader's search runs ($NEUROVEC_DATA, then the cache) and a download needs --download."""
    import runpy
    from neurovec.datasets import tu
    script = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "train_tu.py"))
    args = script["parse_args"](["--datasets", "MUTAG"])
    assert args.data_dir is None and args.download is False
    monkeypatch.setattr(tu, "DEFAULT_CACHE", tmp_path / "cache")
    monkeypatch.setenv("NEUROVEC_DATA", str(tu_dir.parent))   # the folder holding tu/MUTAG/
    assert load_tu("MUTAG", args.data_dir, download=args.download).n_graphs == 188
    monkeypatch.setenv("NEUROVEC_DATA", str(tmp_path))
    with pytest.raises(TUFormatError, match=r"set NEUROVEC_DATA to the folder that holds MUTAG/ or tu/MUTAG/"):
        load_tu("MUTAG", args.data_dir, download=args.download)
