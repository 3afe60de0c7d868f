"""The planner: code hashes from what a stage imports; one plan for every layer's targets and paths."""
from pathlib import Path

import yaml

from retinabench.plan import WorkflowPlan
from retinabench.plan.code import rule_code_files, rule_code_hash

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "src" / "retinabench"


def files(rule, *extra):
    return {str(p.relative_to(PKG)) for p in rule_code_files(rule, tuple(extra))}


def test_manifest_code_covers_only_its_adapter_and_the_manifest_stage():
    tvhl = files("manifest", "retinabench.data.adapters.tvhl")
    assert {"data/adapters/tvhl.py", "data/adapters/common.py", "data/adapters/labels.py", "data/image_checks.py",
            "data/subsample.py", "data/raw_state.py", "pipeline/data.py"} <= tvhl
    assert "data/adapters/phantom.py" not in tvhl and "data/adapters/__init__.py" not in tvhl
    assert "data/splits.py" not in tvhl  # editing the split code does not rebuild manifests
    assert rule_code_hash("manifest", "retinabench.data.adapters.tvhl") != rule_code_hash(
        "manifest", "retinabench.data.adapters.phantom")


def test_code_is_what_the_stage_imports_not_a_hand_written_list():
    frozen = files("frozen")
    # the hand-written list of probes.smk missed these two
    assert {"schemas.py", "features/extract.py", "protocols/knn.py", "pipeline/probes.py"} <= frozen
    assert "protocols/finetune.py" not in frozen and "reliability/evaluation.py" not in frozen
    split = files("split")
    assert "data/splits.py" in split and "data/phantom.py" not in split  # another stage's lazy import
    assert "pipeline/data.py" in split
    assert {"stats/friedman.py", "figures/cd.py", "analysis/families.py"} <= files("critical_difference")
    assert files("sweep_linear") == files("sweep_finetune")  # one stage for both rules


def test_one_plan_gives_every_layer_its_paths_and_targets():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config.update(yaml.safe_load((REPO / "config" / "finetune_demo.yaml").read_text()))
    p = WorkflowPlan(config)
    preds = p.reliability.prediction_files()
    sources = {k.split("/")[0] for k in preds}
    assert sources == {"frozen", "finetune", "linear_aug", "transfer"}
    assert len(preds) == len(p.encoders) * len(p.tasks) + len(p.finetune.prediction_files()) + len(
        p.reliability.transfer_prediction_files())
    assert set(p.metrics_files()) >= set(p.finetune.metrics_files()) and p.finetune.metrics_files()
    targets = p.all_targets()
    assert f"{p.R}/metrics.parquet" in targets and f"{p.R}/reliability/paired_comparisons.parquet" in targets
    assert f"{p.R}/sweep/lr_sensitivity.parquet" in targets
