"""Start-up checks of a configuration (retinabench.plan.selection.check_config: what needs more than the config
itself; the config's own problems are retinabench.settings.load's) and per-adapter code hashes."""
import copy
import os
from pathlib import Path

import pytest
import yaml

from retinabench.settings import ConfigError as SettingsError
from retinabench.settings import load
from retinabench.plan.selection import ConfigError, check_config, device_problems, plan

REPO = Path(__file__).resolve().parents[1]


def base_config(**over):
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["registries"] = {k: str(REPO / v) for k, v in cfg["registries"].items()}
    cfg.update(over)
    return cfg


def problems(cfg, **kw):
    cfg = load(cfg).plain()
    with pytest.raises(ConfigError) as err:
        check_config(cfg, plan(cfg), **kw)
    return err.value.problems


def test_the_default_config_passes_and_notes_unbuilt_manifests(tmp_path):
    cfg = base_config(results=str(tmp_path))
    cfg = load(cfg).plain()
    notes = check_config(cfg, plan(cfg))
    assert any("no manifest yet for phantom, phantom_siteb" in n for n in notes)


def test_config_problems_are_all_listed_at_once(tmp_path):
    cfg = base_config(results=str(tmp_path))
    cfg["split"] = {**cfg["split"], "fractions": {"train": 0.8, "val": 0.15, "test": 0.15}}
    cfg["features"] = {"batch_size": 64, "device": "gpu"}
    cfg["knn"] = {"k": 0}
    with pytest.raises(SettingsError) as err:
        load(cfg)
    found = err.value.problems
    assert len(found) == 3, found
    assert found[0].startswith("split.fractions: split fractions must sum to 1") and "sum 1.1" in found[0]
    assert found[1] == "features.device: not a device (auto, cpu, cuda, cuda:N or mps) (got 'gpu')"
    assert found[2].startswith("knn.k: Input should be greater than or equal to 1; or Input should be 'auto'")


def test_start_up_problems_are_all_listed_at_once(tmp_path):
    cfg = base_config(results=str(tmp_path), encoders=["efficientnet_lite0_in1k", "dinov2_vitb14"])
    cfg["features"] = {"batch_size": 64, "device": "cuda:99"}
    found = problems(cfg)
    assert len(found) == 2, found
    assert "encoder 'dinov2_vitb14' is not locked (hub weights)" in found[0]
    assert "retinabench lock-encoders dinov2_vitb14" in found[0] and "encoders.lock.yaml" in found[0]
    assert found[1].startswith("features.device: 'cuda:99' but this machine has")


def test_devices_that_do_not_exist_are_refused():
    assert device_problems("auto", "d", local=True) == [] and device_problems("cpu", "d", local=False) == []
    assert "is given 1 GPU(s)" in device_problems("cuda:1", "d", local=False)[0]
    assert device_problems("cuda:0", "d", local=False) == []
    import torch
    if not torch.cuda.is_available():
        assert "no CUDA device" in device_problems("cuda", "d", local=True)[0]
    else:
        n = torch.cuda.device_count()
        assert f"has {n} CUDA device(s)" in device_problems(f"cuda:{n}", "d", local=True)[0]


@pytest.mark.shared
def test_knn_k_and_class_placement_are_checked_on_built_manifests(tvhl_copy, tmp_path, make_manifest_job):
    from retinabench.pipeline import run_stage
    results = tmp_path / "results"
    run_stage("manifest", make_manifest_job(tvhl_copy, results))
    cfg = base_config(results=str(results), data_root=str(tvhl_copy.parent), datasets=["tvhl"],
                      tasks=["tvhl_cfp_dme", "tvhl_oct_dme"])
    cfg["knn"] = {"k": 100000, "temperature": 0.07}
    found = problems(cfg)
    assert any("knn.k = 100000 but task 'tvhl_cfp_dme' has" in p and "training images in the full" in p
               for p in found), found
    assert any("in the balanced training set" in p for p in found)
    auto = copy.deepcopy(cfg)
    auto["knn"] = {"k": "auto", "temperature": 0.07}
    assert check_config(auto, plan(auto)) == []
    rare = copy.deepcopy(auto)
    rare["tasks"] = ["tvhl_cfp_dr3"]  # 24 fundus images: PDR is held by too few patients for three splits
    found = problems(rare)
    assert any("split of task 'tvhl_cfp_dr3': class" in p and "3 needed" in p for p in found), found
    # a manifest older than its raw inputs is about to be rebuilt: its content does not block the run
    csv = tvhl_copy / "EYE FUNDUS.csv"
    later = (results / "data/tvhl/manifest.parquet").stat().st_mtime + 10
    os.utime(csv, (later, later))
    notes = check_config(rare, plan(rare))
    assert any("the manifest is older than" in n for n in notes), notes
