import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from retinabench.features.extract import extract_features, load_features, to_model_input
from retinabench.models import build_encoder
from retinabench.schemas import write_table


def make_cache(tmp_path, n=10, size=224):
    arr = np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    np.save(tmp_path / "c.npy", arr)
    write_table(pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "row": np.arange(n)}), tmp_path / "c.parquet",
                "image_index")
    return arr


def test_streamed_features_equal_a_direct_forward(tmp_path, registries):
    arr = make_cache(tmp_path)
    enc = build_encoder(registries.encoder("vit_tiny_random"))
    info = extract_features(enc, tmp_path / "c.npy", tmp_path / "c.parquet", tmp_path / "f.parquet", batch_size=4,
                            device="cpu", progress=False)
    assert info["n_images"] == 10 and info["dim"] == 192
    assert pq.ParquetFile(tmp_path / "f.parquet").num_row_groups == 3  # one row group per batch: streamed
    ids, feats = load_features(tmp_path / "f.parquet")
    assert list(ids) == [f"i{k}" for k in range(10)] and feats.dtype == np.float32
    with torch.inference_mode():
        direct = enc.module(to_model_input(arr, enc, torch.device("cpu"))).numpy()
    np.testing.assert_allclose(feats, direct, rtol=1e-4, atol=1e-4)


def test_input_is_normalised_with_the_entry_statistics(registries):
    enc = build_encoder(registries.encoder("efficientnet_lite0_in1k"))
    x = to_model_input(np.full((1, 224, 224, 3), 255, dtype=np.uint8), enc, torch.device("cpu"))
    assert torch.allclose(x, torch.ones_like(x))  # 'inception' normalisation maps 255 -> +1
    small = to_model_input(np.zeros((1, 64, 64, 3), dtype=np.uint8), enc, torch.device("cpu"))
    assert small.shape == (1, 3, 224, 224)  # resized to the encoder's input size


def test_non_finite_embeddings_are_an_error(tmp_path, registries):
    make_cache(tmp_path, n=3)
    enc = build_encoder(registries.encoder("resnet18_random"))
    enc.module = torch.nn.Sequential(enc.module, torch.nn.Dropout(p=0.0))
    enc.module[0].fc = torch.nn.Identity()
    with torch.no_grad():
        enc.module[0].conv1.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="non-finite embedding"):
        extract_features(enc, tmp_path / "c.npy", tmp_path / "c.parquet", tmp_path / "f.parquet", progress=False)
