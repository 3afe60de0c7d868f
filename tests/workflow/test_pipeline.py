"""End to end: the Snakemake workflow on a tiny phantom config, reruns, change detection, provenance."""
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from retinabench.schemas import METRICS, read_table

pytestmark = pytest.mark.slow


def test_outputs_and_tidy_metrics(tiny_workflow):
    r = tiny_workflow / "results"
    metrics = read_table(r / "metrics.parquet", "metrics")
    assert list(metrics.columns) == METRICS.names
    assert set(metrics["encoder"]) == {"efficientnet_lite0_in1k", "vit_tiny_random"}
    assert set(metrics["task"]) == {"phantom_cfp_dr3", "phantom_cfp_glaucoma", "phantom_oct_dme",
                                  "phantom_cfp_anydr"}
    assert set(metrics["protocol"]) == {"knn", "linear", "logreg"}
    assert set(metrics["regime"]) == {"u-u", "u-b", "b-b", "b-u"}
    assert set(metrics.loc[metrics["protocol"] == "linear", "seed"]) == {0, 1}
    preds = pd.read_parquet(r / "predictions/frozen/efficientnet_lite0_in1k/phantom_cfp_dr3.parquet")
    assert {"p_none", "p_npdr", "p_pdr"} <= set(preds.columns)
    summary = pd.read_csv(r / "analysis/rank_summary.csv")
    assert {"mean_rank", "sd_rank", "n_tasks"} <= set(summary.columns)
    assert (r / "figures/rank_distribution.png").stat().st_size > 10_000
    excl = read_table(r / "data/phantom/exclusions.parquet", "exclusions")
    assert list(excl.columns) == ["dataset", "source", "image_id", "scope", "reason"]
    # one writer per results folder (issue 23, fault 3): the run took the lock in results/ and released it
    assert f"retinabench: locked the results folder {r}" in (tiny_workflow / "run.log").read_text()
    assert not (r / ".retinabench.lock").exists()
    assert not list(r.rglob("*.tmp"))  # every temporary file renamed or removed


def test_second_run_does_nothing(tiny_workflow, run_snakemake):
    out = run_snakemake(tiny_workflow, "-n")
    assert "Nothing to be done" in out.stdout + out.stderr


def test_editing_one_encoder_entry_reruns_only_its_features(tiny_workflow, tmp_path, run_snakemake):
    work = tmp_path / "repo"
    shutil.copytree(tiny_workflow, work, symlinks=True)
    reg_path = work / "config/encoders.yaml"
    reg = yaml.safe_load(reg_path.read_text())
    reg["vit_tiny_random"]["notes"] = "edited"
    reg_path.write_text(yaml.safe_dump(reg))
    plan = run_snakemake(work, "-n").stdout
    jobs = {line.split()[0]: int(line.split()[1]) for line in plan.split("Job stats:")[1].splitlines()[3:]
            if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert jobs["features"] == 1 and jobs["frozen"] == 4  # vit_tiny × 4 tasks; efficientnet untouched
    assert "manifest" not in jobs and "split" not in jobs and "image_cache" not in jobs
    assert "output: results/features/vit_tiny_random/phantom.parquet" in plan
    assert "output: results/features/efficientnet_lite0_in1k/phantom.parquet" not in plan


def test_provenance_chain_reaches_raw_images_and_weights(tiny_workflow):
    cli = [sys.executable, "-m", "retinabench", "provenance", "results/figures/rank_distribution.png"]
    out = subprocess.run(cli, cwd=tiny_workflow, capture_output=True, text=True, check=True).stdout
    for needle in ("rule figure_rank_distribution", "rule ranks", "rule collect_metrics", "rule frozen",
                   "rule features", "rule split", "rule image_cache", "rule manifest", "rule phantom",
                   "raw data:", "weights:",
                   "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
                   "none (random init)"):
        assert needle in out, f"{needle!r} missing from provenance output:\n{out}"
    assert "CHANGED" not in out and "MISSING" not in out


def test_analysis_follows_the_papers_conventions(tiny_workflow):
    """Signed distances with declared references, the analysis protocol named, the ECE vocabulary, the fairness
    scatter on by default (from the reliability layer's subgroup table)."""
    import math
    r = tiny_workflow / "results"
    dist = pd.read_csv(r / "analysis/signed_rank_distance.csv")
    assert {"reference", "comparison", "distance", "meaning"} <= set(dist.columns) and dist["meaning"].str.len().gt(0).all()
    pairs = dict(zip(dist.loc[dist["family"] == "protocols", "name"], dist.loc[dist["family"] == "protocols",
                                                                                "reference"]))
    assert pairs == {"linear vs knn": "linear", "logreg vs knn": "logreg", "linear vs logreg": "linear"}
    assert (dist["distance"] - (dist["rank_reference"] - dist["rank_comparison"]) / math.sqrt(2)).abs().max() < 1e-5
    # subset vs rest: the rest is the reference, so an encoder ranking better on the subset is positive
    ranks = pd.read_parquet(r / "analysis/ranks.parquet")
    ranks = ranks[(ranks["metric"] == "accuracy") & (ranks["protocol"] == "linear") & (ranks["regime"] == "u-u")]
    sub = dist[dist["name"] == "oct vs rest"].set_index("encoder")
    assert set(sub["reference"]) == {"rest"} and set(sub["comparison"]) == {"oct"}
    for enc, row in sub.iterrows():
        mine = ranks[ranks["encoder"] == enc]
        on_oct = mine.loc[mine["task"] == "phantom_oct_dme", "rank"].mean()
        rest = mine.loc[mine["task"] != "phantom_oct_dme", "rank"].mean()
        assert row["distance"] == pytest.approx((rest - on_oct) / math.sqrt(2), abs=1e-5)
    # no fine-tuning in this run: the single-protocol analyses name their fallback
    top = pd.read_csv(r / "analysis/top_k.csv")
    assert set(top["protocol"]) == {"linear"} and set(top["protocol_role"]) == {"fallback: finetune not run"}
    # fairness scatter: on by default, one point per encoder and dataset
    fair = pd.read_csv(r / "analysis/subgroup_accuracy.csv")
    points = fair[fair["reason"].isna()]
    assert set(points["attribute"]) == {"age", "sex"} and set(points["dataset"]) == {"phantom"}
    assert len(points) == 2 * 2 and (points["n_seeds"] == 2).all()
    assert (r / "figures/subgroup_accuracy.png").stat().st_size > 10_000
    # one ECE vocabulary: `ece` (positive class) for binary tasks only, `ece_top_label` everywhere
    metrics = read_table(r / "metrics.parquet", "metrics")
    assert set(metrics.loc[metrics["metric"] == "ece", "task"]) == {"phantom_cfp_glaucoma", "phantom_oct_dme",
                                                                    "phantom_cfp_anydr"}
    assert set(metrics.loc[metrics["metric"] == "ece_top_label", "task"]) == set(metrics["task"])
    rel = pd.read_parquet(r / "reliability/metrics.parquet")
    assert {"y_pred", "none"} <= set(rel["threshold"]) and "argmax" not in set(rel["threshold"])
    assert set(rel.loc[rel["task"] == "phantom_cfp_dr3", "metric"]) >= {"ece_top_label"}
    assert "ece" not in set(rel.loc[rel["task"] == "phantom_cfp_dr3", "metric"])
    assert set(rel["bootstrap_unit"]) == {"patient"}
