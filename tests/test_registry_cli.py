import subprocess
import sys

import pytest
import yaml

from retinabench.registry import RegistryError, load_registry


def test_shipped_registries_validate(registries):
    assert {"phantom", "tvhl"} <= set(registries.datasets)
    assert registries.task("tvhl_cfp_dr3")["classes"] == ["none", "npdr", "pdr"]
    from retinabench.registry.lockfile import weights_origin
    for name, enc in registries.encoders.items():
        origin = weights_origin(enc)  # every pretrained entry says where its weights come from
        assert (origin == "none") == (enc.get("init") == "random"), name
        if origin in ("package", "path"):
            assert enc.get("sha256"), name


def test_invalid_entry_names_entry_and_key(tmp_path):
    p = tmp_path / "encoders.yaml"
    p.write_text(yaml.safe_dump({"bad": {"source": "timm", "architecture": "resnet18", "domain": "marine",
                                          "method": "x", "input_size": 224, "normalization": "imagenet",
                                          "pooling": "avg", "size_class": "tiny"}}))
    with pytest.raises(RegistryError, match=r"entry 'bad', key domain"):
        load_registry(p, "encoders")
    p.write_text(yaml.safe_dump({"t": {"dataset": "d", "label": "l", "classes": ["a", "a"], "modality": "cfp",
                                        "ordinal": False}}))
    with pytest.raises(RegistryError, match="lists a class twice"):
        load_registry(p, "tasks")


def test_random_entry_may_not_carry_a_weight_pin(tmp_path):
    p = tmp_path / "encoders.yaml"
    p.write_text(yaml.safe_dump({"r": {"source": "timm", "architecture": "resnet18", "init": "random",
                                        "sha256": "0" * 64, "domain": "none", "method": "x", "input_size": 224,
                                        "normalization": "imagenet", "pooling": "avg", "size_class": "tiny"}}))
    with pytest.raises(RegistryError, match="entry 'r'"):
        load_registry(p, "encoders")


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "retinabench", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.slow
def test_cli_lists_and_targets(tmp_path):
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    out = run_cli("encoders", cwd=repo)
    assert out.returncode == 0 and "efficientnet_lite0_in1k" in out.stdout and "dinov2_vitb14" in out.stdout
    assert "tvhl_oct_dme" in run_cli("tasks", cwd=repo).stdout
    out = run_cli("targets", "--configfile", "config/tvhl.yaml", "--task", "tvhl_cfp_dme", cwd=repo)
    listed = out.stdout.split()
    assert out.returncode == 0 and len(listed) == len(set(listed)), out.stderr
    for path in ("results/tvhl/metrics/frozen/efficientnet_lite0_in1k/tvhl_cfp_dme.parquet",
                 "results/tvhl/metrics/frozen/resnet18_random/tvhl_cfp_dme.parquet",
                 "results/tvhl/predictions/frozen/resnet18_random/tvhl_cfp_dme.parquet",
                 "results/tvhl/splits/tvhl/tvhl_cfp_dme.parquet", "results/tvhl/metrics.parquet",
                 "results/tvhl/figures/rank_distribution.png", "results/tvhl/analysis/baselines.csv",
                 "results/tvhl/reliability/jobs/frozen/resnet18_random/tvhl_cfp_dme/calibration.parquet"):
        assert path in listed, path
    assert not [p for p in listed if "/features/" in p or "tvhl_oct_dme" in p]  # features depend on no task
    one = run_cli("targets", "--configfile", "config/tvhl.yaml", "--encoder", "resnet18_random", cwd=repo)
    mine = one.stdout.split()
    assert "results/tvhl/features/resnet18_random/tvhl.parquet" in mine and "results/tvhl/metrics.parquet" in mine
    assert not [p for p in mine if "efficientnet_lite0_in1k" in p]
    both = run_cli("targets", "--configfile", "config/tvhl.yaml", "--encoder", "resnet18_random",
                   "efficientnet_lite0_in1k", "--task", "tvhl_cfp_dme", cwd=repo).stdout.split()
    assert set(both) == set(listed) - {"results/tvhl/splits/tvhl/tvhl_cfp_dme.parquet",
                                       "results/tvhl/analysis/baselines.csv"}
    bad = run_cli("targets", "--task", "tvhl_cfp_dme", cwd=repo)
    assert bad.returncode != 0 and "not selected by the config" in bad.stdout + bad.stderr
    missing = run_cli("provenance", str(tmp_path / "nothing.png"), cwd=repo)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "bare.png").write_bytes(b"x")
    bare = run_cli("provenance", str(tmp_path / "bare.png"), cwd=repo)
    assert bare.returncode == 2 and "no provenance sidecar" in bare.stderr
