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


@pytest.fixture(scope="module")
def tiny_duals(tmp_path_factory):
    from retinabench.models.tiny import build_tiny_hf_clip, build_tiny_open_clip, build_tiny_siglip
    root = tmp_path_factory.mktemp("duals")
    oc, hfc, sig = build_tiny_open_clip(root / "oc"), build_tiny_hf_clip(root / "hfc"), build_tiny_siglip(root / "sig")
    return {"open_clip": (oc, root / "oc" / oc["weights_file"]), "hf_clip": (hfc, root / "hfc"),
            "siglip": (sig, root / "sig")}


@pytest.mark.parametrize("kind", ["open_clip", "hf_clip", "siglip"])
def test_projected_l2_probe_embedding_is_the_unit_norm_joint_space_embedding(tiny_duals, kind, tmp_path):
    """features.probe_embedding: projected_l2 (FOCUS) = the dual encoder's image embedding, L2-normalised;
    pre_projection (ours) = the entry's pooling, before the projection."""
    from retinabench.features.extract import build_probe_encoder
    from retinabench.models.dual_encoder import load_dual_encoder
    entry, weights = tiny_duals[kind]
    size = entry["input_size"]
    make_cache(tmp_path, n=5, size=size)
    ours, focus = (build_probe_encoder(entry, p, weights) for p in ("pre_projection", "projected_l2"))
    assert "probe_embedding" not in ours.weights and focus.weights["probe_embedding"].startswith("projected_l2")
    for enc, name in ((ours, "a"), (focus, "b")):
        extract_features(enc, tmp_path / "c.npy", tmp_path / "c.parquet", tmp_path / f"{name}.parquet",
                         batch_size=2, device="cpu", progress=False)
    (_, a), (_, b) = load_features(tmp_path / "a.parquet"), load_features(tmp_path / "b.parquet")
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-3)
    dual = load_dual_encoder(entry, weights)
    x = to_model_input(np.load(tmp_path / "c.npy"), dual, torch.device("cpu"))
    with torch.inference_mode():
        joint = dual.encode_image(x).numpy()
    np.testing.assert_allclose(b, joint / np.linalg.norm(joint, axis=1, keepdims=True), atol=1e-5)
    if kind == "siglip":  # SigLIP has no projection: its pooled output is the joint space, only normalised
        np.testing.assert_allclose(b, a / np.linalg.norm(a, axis=1, keepdims=True), atol=1e-5)
    else:  # the projection moves the embedding: not just a rescaling of the pre-projection one
        assert a.shape[1] != b.shape[1] or not np.allclose(b, a / np.linalg.norm(a, axis=1, keepdims=True),
                                                           atol=1e-3)


def test_projected_l2_of_an_encoder_without_a_joint_space_is_its_pooling_normalised(tmp_path, registries):
    from retinabench.features.extract import build_probe_encoder
    arr = make_cache(tmp_path, n=4)
    entry = registries.encoder("vit_tiny_random")
    ours, focus = build_probe_encoder(entry), build_probe_encoder(entry, "projected_l2")
    x = to_model_input(arr, ours, torch.device("cpu"))
    with torch.inference_mode():
        a, b = ours.module(x).numpy(), focus.module(x).numpy()
    np.testing.assert_allclose(b, a / np.linalg.norm(a, axis=1, keepdims=True), atol=1e-5)
    assert "no joint space" in focus.weights["probe_embedding"]
    with pytest.raises(ValueError, match="probe_embedding"):
        build_probe_encoder(entry, "projected")
