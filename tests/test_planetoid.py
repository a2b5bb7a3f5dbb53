"""datasets.load_planetoid reads the raw Planetoid files exactly as PyG's Planetoid does, and says clearly
what is missing."""
from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest

from neurovec.datasets import planetoid
from neurovec.datasets._common import DatasetError
from neurovec.datasets.planetoid import load_planetoid, normalize_features


@pytest.fixture(scope="module")
def cora(planetoid_dir):
    return load_planetoid("Cora", planetoid_dir)


def test_cora_sizes(cora):
    assert (cora.n_nodes, cora.n_edges, cora.num_features, cora.num_classes) == (2708, 10556, 1433, 7)
    assert (cora.train_mask.sum(), cora.val_mask.sum(), cora.test_mask.sum()) == (140, 500, 1000)
    assert cora.x.dtype == np.float32


def test_cora_equals_pyg_reading_the_same_raw_files(cora, planetoid_dir, tmp_path):
    pyg = pytest.importorskip("torch_geometric.datasets")
    shutil.copytree(planetoid_dir / "Cora" / "raw", tmp_path / "Cora" / "raw")  # PyG processes offline from raw/
    data = pyg.Planetoid(str(tmp_path), "Cora")[0]
    assert np.array_equal(data.x.numpy(), cora.x)
    assert np.array_equal(data.edge_index.numpy(), cora.edge_index)
    assert np.array_equal(data.y.numpy(), cora.y)
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(data, mask).numpy(), getattr(cora, mask)), mask


def test_name_in_any_case_and_neurovec_data(planetoid_dir, monkeypatch):
    monkeypatch.setenv("NEUROVEC_DATA", str(planetoid_dir))
    assert load_planetoid("cora").n_nodes == 2708          # no data_dir: $NEUROVEC_DATA
    monkeypatch.setenv("NEUROVEC_DATA", str(planetoid_dir.parent))
    assert load_planetoid("CORA").n_nodes == 2708          # .../planetoid/Cora/raw is found too


def test_missing_file_is_named(planetoid_dir, tmp_path):
    raw = tmp_path / "Cora" / "raw"
    shutil.copytree(planetoid_dir / "Cora" / "raw", raw)
    (raw / "ind.cora.tx").unlink()
    with pytest.raises(DatasetError, match=r"missing file .*ind\.cora\.tx"):
        load_planetoid("Cora", tmp_path)


def test_data_dir_without_the_dataset(tmp_path):
    with pytest.raises(DatasetError, match="has no ind.cora.x"):
        load_planetoid("Cora", tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_planetoid("Cora", tmp_path / "nowhere")
    with pytest.raises(DatasetError, match="unknown Planetoid dataset 'Coraa'"):
        load_planetoid("Coraa", tmp_path)


def test_offline_download_fails_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("NEUROVEC_DATA", raising=False)
    monkeypatch.setattr(planetoid, "DEFAULT_CACHE", tmp_path / "cache")
    monkeypatch.setattr(planetoid, "PLANETOID_URL", "http://127.0.0.1:9/data")  # nothing listens on port 9
    with pytest.raises(planetoid.PlanetoidDownloadError) as error:
        load_planetoid("Cora")
    assert "\n" not in str(error.value) and "offline?" in str(error.value)
    with pytest.raises(DatasetError, match="download=False"):
        load_planetoid("Cora", download=False)


def test_a_pickle_naming_other_code_is_refused(planetoid_dir, tmp_path):
    raw = tmp_path / "Cora" / "raw"
    shutil.copytree(planetoid_dir / "Cora" / "raw", raw)
    (raw / "ind.cora.graph").chmod(0o644)
    (raw / "ind.cora.graph").write_bytes(pickle.dumps(shutil.rmtree))
    with pytest.raises(DatasetError, match=r"ind\.cora\.graph: cannot be read.*shutil\.rmtree"):
        load_planetoid("Cora", tmp_path)


def test_test_index_past_the_end(planetoid_dir, tmp_path):
    raw = tmp_path / "Cora" / "raw"
    shutil.copytree(planetoid_dir / "Cora" / "raw", raw)
    (raw / "ind.cora.test.index").chmod(0o644)
    (raw / "ind.cora.test.index").write_text("5\n99999\n")
    with pytest.raises(DatasetError, match=r"ind\.cora\.test\.index, line 2: node 99999 is past the end"):
        load_planetoid("Cora", tmp_path)


def test_normalize_features_like_pyg(cora):
    pyg = pytest.importorskip("torch_geometric.transforms")
    import torch
    from torch_geometric.data import Data
    expected = pyg.NormalizeFeatures()(Data(x=torch.as_tensor(cora.x, dtype=torch.float64))).x.numpy()
    assert np.allclose(normalize_features(cora.x), expected, rtol=0, atol=1e-15)
