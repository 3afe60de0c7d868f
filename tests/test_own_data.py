"""The documented own-data path (docs/datasets.md, "Your own data"): config/examples/own_data.yaml adds a dataset
read by the generic table adapter from a user registry file beside the shipped ones; `datasets --check` reads it
and checks its size against the run, and a Snakemake dry run plans it. The data: a tiny generated folder."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_in_copy

REPO = Path(__file__).resolve().parents[1]
CONFIG = "config/examples/own_data.yaml"


def make_my_fundus(data_root: Path, n_patients: int, eyes: tuple[str, ...] = ("R", "L")) -> Path:
    """``<data_root>/my_fundus``: labels.csv (file, patient, eye, grade) and one small PNG per row; grade
    alternates by patient."""
    root = data_root / "my_fundus"
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["file,patient,eye,grade"]
    for p in range(n_patients):
        for eye in eyes:
            name = f"P{p:03d}_{eye}.png"
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "images" / name)
            lines.append(f"{name},P{p:03d},{eye},{p % 2}")
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return data_root


def retinabench(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "retinabench", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.slow
def test_own_data_is_checked_and_dry_runs_as_documented(tmp_path, dry_run_workdir):
    data = make_my_fundus(tmp_path / "data", n_patients=30)
    check = retinabench("datasets", "--check", "--configfile", CONFIG, "--config", f"data_root={data}")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "my_fundus  ok" in check.stdout and "60" in check.stdout
    dry = run_in_copy(dry_run_workdir, [str(Path(sys.executable).with_name("snakemake")), "-n", "--profile",
                                        "profiles/local", "--configfile", CONFIG, "--config", f"data_root={data}"])
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-4000:]
    assert "results/own_data/data/my_fundus/manifest.parquet" in out
    assert "my_fundus_cfp_referable" in out


def test_a_six_image_dataset_fails_the_check_naming_dataset_task_split_and_k(tmp_path):
    data = make_my_fundus(tmp_path / "data", n_patients=6, eyes=("R",))
    check = retinabench("datasets", "--check", "--configfile", CONFIG, "--config", f"data_root={data}")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "my_fundus  too_small" in check.stdout
    assert ("dataset 'my_fundus': knn.k = 20 but task 'my_fundus_cfp_referable' has 2 training images in the full "
            "training set (split 'train', regimes u-*)") in check.stdout
    ok = retinabench("datasets", "--check", "--configfile", CONFIG, "--config", f"data_root={data}", "knn={k: 2}",
                     "regimes=[u-u]")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_a_class_with_too_few_patients_fails_the_check(tmp_path):
    data = make_my_fundus(tmp_path / "data", n_patients=5)  # class 'yes': 2 patients, 3 splits
    check = retinabench("datasets", "--check", "--configfile", CONFIG, "--config", f"data_root={data}")
    assert check.returncode == 1 and "too_small" in check.stdout, check.stdout + check.stderr
    assert "dataset 'my_fundus'" in check.stdout and "class 'yes'" in check.stdout
    assert "my_fundus_cfp_referable" in check.stdout
