"""`retinabench evaluate`: the benchmark's metrics for any file in the predictions schema."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn import metrics as skm

from retinabench.metrics.classification import metrics_table
from retinabench.schemas import METRICS, read_table, write_table

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "retinabench", *args], cwd=REPO, capture_output=True, text=True)


def predictions(task="phantom_cfp_glaucoma", n=60, seed=0):
    """A model run outside the pipeline: its hard decision is a threshold of 0.35, not the argmax."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(0.3 * y + rng.uniform(0, 0.7, n), 0, 1)
    rows = pd.DataFrame({"image_id": [f"img{i}" for i in range(n)], "dataset": "phantom", "task": task,
                         "encoder": "my_model", "protocol": "external", "seed": 0, "regime": "u-u",
                         "split": np.where(np.arange(n) < n // 2, "val", "test"), "y_true": y,
                         "y_pred": (p >= 0.35).astype(int), "p_no": 1 - p, "p_yes": p})
    return rows


@pytest.mark.slow
def test_evaluate_writes_the_metrics_table_of_y_pred_as_written(tmp_path):
    preds = predictions()
    src = write_table(preds, tmp_path / "preds.parquet", "predictions")
    out = tmp_path / "metrics.parquet"
    proc = run_cli("evaluate", str(src), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    got = read_table(out, "metrics")
    assert list(got.columns) == METRICS.names
    task = yaml.safe_load((REPO / "config/tasks.yaml").read_text())["phantom_cfp_glaucoma"]
    ref = metrics_table(preds, {"phantom_cfp_glaucoma": task})
    pd.testing.assert_frame_equal(got.reset_index(drop=True), ref[METRICS.names].reset_index(drop=True),
                                  check_dtype=False)
    test = preds[preds["split"] == "test"]
    acc = got[(got["split"] == "test") & (got["metric"] == "accuracy")]["value"].item()
    assert acc == pytest.approx(skm.accuracy_score(test["y_true"], test["y_pred"]))
    assert acc != pytest.approx(skm.accuracy_score(test["y_true"], test[["p_no", "p_yes"]].to_numpy().argmax(1)))
    assert {"ece", "ece_top_label"} <= set(got["metric"])
    assert (tmp_path / "metrics.parquet.prov.json").is_file()  # auditable like every pipeline artifact
    assert "accuracy" in proc.stdout and "test" in proc.stdout


@pytest.mark.slow
def test_evaluate_with_a_task_registry_of_ones_own(tmp_path):
    preds = predictions(task="my_task")
    src = write_table(preds, tmp_path / "preds.parquet", "predictions")
    bad = run_cli("evaluate", str(src), "-o", str(tmp_path / "m.parquet"))
    assert bad.returncode == 2 and "my_task" in bad.stderr and "--tasks" in bad.stderr
    reg = tmp_path / "tasks.yaml"
    reg.write_text(yaml.safe_dump({"my_task": {"dataset": "phantom", "modality": "cfp", "label": "x",
                                               "classes": ["no", "yes"], "ordinal": False}}))
    ok = run_cli("evaluate", str(src), "-o", str(tmp_path / "m.parquet"), "--tasks", str(reg))
    assert ok.returncode == 0, ok.stderr
    assert set(read_table(tmp_path / "m.parquet", "metrics")["task"]) == {"my_task"}


def test_evaluate_rejects_a_file_outside_the_schema(tmp_path):
    preds = predictions().drop(columns="y_pred")
    path = tmp_path / "preds.parquet"
    preds.to_parquet(path)
    proc = run_cli("evaluate", str(path), "-o", str(tmp_path / "m.parquet"))
    assert proc.returncode == 2 and "y_pred" in proc.stderr and not (tmp_path / "m.parquet").exists()
