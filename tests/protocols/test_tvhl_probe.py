"""A real probe run on TVHL: image cache -> EfficientNet-Lite0 features -> split -> frozen protocols -> metrics."""
import numpy as np
import pytest

from retinabench.data.image_cache import build_image_cache
from retinabench.data.splits import make_split
from retinabench.features.extract import extract_features, load_features
from retinabench.metrics.classification import metrics_table
from retinabench.models import build_encoder
from retinabench.protocols.frozen import run_frozen


@pytest.mark.slow
@pytest.mark.shared
def test_pretrained_probe_on_tvhl_oct_dme(tvhl_root, tvhl_manifest, registries, tmp_path):
    manifest, _ = tvhl_manifest
    task = registries.task("tvhl_oct_dme")
    oct_ = manifest[manifest["modality"] == "oct"]
    # A patient-level subsample keeps the test short: every DME-positive patient plus as many negatives.
    pos = oct_.loc[oct_["dme"] == "yes", "patient_id"].unique()
    neg = np.random.default_rng(0).choice(sorted(set(oct_["patient_id"]) - set(pos)), size=len(pos), replace=False)
    sub = manifest[manifest["patient_id"].isin(set(pos) | set(neg)) & (manifest["modality"] == "oct")]
    sub = sub.reset_index(drop=True)
    build_image_cache(sub, tvhl_root, tmp_path / "img.npy", tmp_path / "img.parquet", progress=False)
    enc = build_encoder(registries.encoder("efficientnet_lite0_in1k"))
    extract_features(enc, tmp_path / "img.npy", tmp_path / "img.parquet", tmp_path / "f.parquet", progress=False)
    ids, feats = load_features(tmp_path / "f.parquet")
    assert list(ids) == list(sub["image_id"]) and feats.shape == (len(sub), 1280)
    split = make_split(sub, task, seed=0)
    cfg = {"linear": {"epochs": 20, "steps_per_epoch": 10}}
    preds, _ = run_frozen(ids, feats, split, task, enc.name, protocols=["knn", "linear", "logreg"], seeds=[0],
                          regimes=["u-u"], cfg=cfg)
    m = metrics_table(preds, {task["name"]: task})
    auroc = m[(m["metric"] == "auroc") & (m["split"] == "test")].set_index("protocol")["value"]
    assert set(auroc.index) == {"knn", "linear", "logreg"}
    assert (auroc > 0.7).all(), auroc.to_dict()
