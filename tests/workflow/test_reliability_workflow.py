"""End to end: the reliability rules on a tiny two-site phantom config with one encoder."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import false_discovery_control

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
ENC = "efficientnet_lite0_in1k"
TINY = {
    "phantom": {"n_patients": 60, "seed": 0, "image_size": 256},
    "encoders": [ENC],
    "seeds": [0, 1],
    "linear": {"epochs": 6, "steps_per_epoch": 8, "batch_size": 64, "lr": 0.001, "weight_decay": 0.0001,
               "warmup_frac": 0.1},
    "reliability": {"paired": {"pairs": [{"a": {"encoder": ENC, "protocol": "logreg"},
                                          "b": {"encoder": ENC, "protocol": "linear"}}]}},
}
KINDS = ("metrics", "thresholds", "calibration", "bins", "subgroups", "gaps", "coverage")


def _run(workdir, *args):
    import os
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    # targets first: --configfile takes several values and would swallow them
    cmd = [SNAKEMAKE, *args, "--profile", "profiles/local", "--cores", "2", "--configfile", "config/tiny.yaml"]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("rel") / "repo"
    work.mkdir()
    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    (work / "config" / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    reg = yaml.safe_load((work / "config" / "datasets.yaml").read_text())
    reg["phantom_siteb"]["options"]["n_patients"] = 60  # smaller second site: faster, still 20+ patients
    (work / "config" / "datasets.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    targets = [f"results/reliability/{k}.parquet" for k in KINDS] + [
        "results/reliability/summary_scores.parquet", "results/reliability/subgroup_metrics.parquet",
        "results/reliability/paired_comparisons.parquet", "results/reliability/paired_domains.parquet"]
    targets += [f"results/figures/reliability/{f}" for f in
                ("reliability_diagrams", "fairness_gaps", "subgroup_scatter", "transfer")]
    _run(work, *targets)
    return work, targets


def test_all_requests_the_reliability_outputs(run):
    work, targets = run
    out = _run(work, "-n", "--forceall", "all").stdout
    for t in targets:
        assert t in out, t


def test_outputs_exist_with_provenance(run):
    work, targets = run
    r = work / "results"
    for t in targets:
        if "/figures/" not in t:
            assert (work / t).is_file() and (work / (t + ".prov.json")).is_file(), t
    for f in ("reliability_diagrams", "fairness_gaps", "subgroup_scatter", "transfer"):
        folder = r / f"figures/reliability/{f}"
        pngs = sorted(folder.glob("*.png"))  # one file per panel group
        assert pngs and all(p.stat().st_size > 10_000 for p in pngs), f
        for p in pngs:
            assert p.with_suffix(".pdf").is_file() and Path(f"{p}.prov.json").is_file(), p
        assert (folder / "skipped.csv").is_file() and (folder / "skipped.csv.prov.json").is_file()
    # one file per dataset / harmonised task: two of each here
    assert sorted(p.stem for p in (r / "figures/reliability/reliability_diagrams").glob("*.png")) == [
        "phantom", "phantom_siteb"]
    assert sorted(p.stem for p in (r / "figures/reliability/transfer").glob("*.png")) == ["any_dr_cfp", "gon_cfp"]
    jobs = sorted(p.relative_to(r / "reliability/jobs").as_posix() for p in (r / "reliability/jobs").glob("*/*/*"))
    assert f"transfer/{ENC}/any_dr_cfp" in jobs and f"transfer/{ENC}/gon_cfp" in jobs
    assert f"frozen/{ENC}/phantom_cfp_anydr" in jobs and f"frozen/{ENC}/phantom_siteb_cfp_glaucoma" in jobs
    side = json.loads((r / "reliability/summary_scores.parquet.prov.json").read_text())
    assert set(side["extra"]["formulas"]) == {"fairness", "quality", "shift"}


def test_threshold_from_source_validation_is_carried_to_ood_test(run):
    work, _ = run
    r = work / "results"
    preds = pd.read_parquet(r / f"predictions/transfer/{ENC}/any_dr_cfp.parquet")
    thr = pd.read_parquet(r / "reliability/thresholds.parquet")
    m = pd.read_parquet(r / "reliability/metrics.parquet")
    cell = dict(source="transfer", train_task="phantom_cfp_anydr", protocol="logreg", seed=0, regime="u-u")
    sel = np.logical_and.reduce([thr[k] == v for k, v in cell.items()]) & (thr["threshold"] == "youden")
    t = thr.loc[sel, "value"].item()
    ood = preds[(preds["train_task"] == cell["train_task"]) & (preds["protocol"] == "logreg")
                & (preds["task"] == "phantom_siteb_cfp_anydr") & (preds["split"] == "test")]
    assert len(ood) > 0
    acc = ((ood["p_yes"] >= t).astype(int) == ood["y_true"]).mean()
    got = m[np.logical_and.reduce([m[k] == v for k, v in cell.items()]) & (m["task"] == "phantom_siteb_cfp_anydr")
            & (m["threshold"] == "youden") & (m["metric"] == "accuracy")]
    assert got["value"].item() == pytest.approx(acc)
    ood_rows = m[(m["source"] == "transfer") & (m["train_dataset"] != m["dataset"])]
    assert {"phantom_siteb_cfp_anydr", "phantom_cfp_anydr", "phantom_cfp_glaucoma"} <= set(ood_rows["task"])


def test_coverage_scores_and_paired_tables(run):
    work, _ = run
    r = work / "results"
    cov = pd.read_parquet(r / "reliability/coverage.parquet")
    ns = cov[cov["status"] == "not_supported"]
    assert set(ns.loc[ns["task"] == "referable_dr", "dataset"]) == {"phantom", "phantom_siteb"}
    assert (cov.loc[cov["status"] == "skipped", "reason"].str.len() > 0).all()
    scores = pd.read_parquet(r / "reliability/summary_scores.parquet")
    assert set(scores["score"]) == {"fairness", "quality", "shift"}
    assert scores["formula"].str.startswith("1 - ").all()
    shift = scores[(scores["score"] == "shift") & (scores["source"] == "frozen") & (scores["task"] == "any_dr_cfp")]
    assert shift["value"].notna().all() and (shift["n_components"] == 2).all()
    nan = scores[scores["value"].isna()]
    assert (nan["reason"].str.len() > 0).all()  # every missing score says why
    comp = pd.read_parquet(r / "reliability/paired_comparisons.parquet")
    assert set(comp["protocol_a"]) == {"logreg"} and set(comp["protocol_b"]) == {"linear"}
    assert (comp["n_boot"] >= 1000).all() and comp["p_value"].between(0, 1).all()
    for _, g in comp.groupby("metric_family"):
        assert g["p_bh"].to_numpy() == pytest.approx(false_discovery_control(g["p_value"].to_numpy(), method="bh"))
    sub = pd.read_parquet(r / "reliability/subgroup_metrics.parquet")
    fairness = pytest.importorskip("retinabench.stats.fairness", reason="analysis layer's fairness module absent")
    fairness.check_subgroups(sub)  # the analysis layer's fairness family can read it


def test_reliability_figures_are_drawn_within_the_print_targets(run, tmp_path, figure_checks):
    render, check = figure_checks
    work, _ = run
    saved = render(work, tmp_path, families=set())
    check(saved, {"reliability_diagrams", "fairness_gaps", "subgroup_scatter", "transfer"})
