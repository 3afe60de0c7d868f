"""The fine-tuning layer end to end: a temp copy of the workflow with fine-tuning and the sweep enabled on a tiny
phantom config (two micro random-init encoders at 32 px), then what a sweep edit reruns. The same run serves the
saliency maps (of its fine-tuned models) and the compute benchmark."""
import json
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from retinabench.protocols.sweep import SENSITIVITY_COLUMNS, choose_lr
from retinabench.schemas import read_table

pytestmark = pytest.mark.slow

MICRO = {
    "vit_micro_random": {"source": "timm", "architecture": "test_vit", "init": "random", "domain": "none",
                         "method": "random initialisation", "exposure": [], "params_m": 0.3, "input_size": 32,
                         "normalization": "imagenet", "pooling": "cls", "size_class": "tiny"},
    "resnet_micro_random": {"source": "timm", "architecture": "test_resnet", "init": "random", "domain": "none",
                            "method": "random initialisation", "exposure": [], "params_m": 0.4, "input_size": 32,
                            "normalization": "imagenet", "pooling": "avg", "size_class": "tiny"},
}
FT_TINY = {
    "datasets": ["phantom"],
    "phantom": {"n_patients": 60, "seed": 0, "image_size": 256},
    "image_cache": {"size": 64, "resize": "squash"},
    "encoders": list(MICRO),
    "seeds": [0],
    "regimes": ["u-u", "u-b"],
    "linear": {"epochs": 3, "steps_per_epoch": 5, "batch_size": 32, "lr": 0.001, "weight_decay": 0.0001,
               "warmup_frac": 0.1},
    "finetune": {"enabled": True, "tasks": ["phantom_oct_dme"], "epochs": 2, "steps_per_epoch": 2, "batch_size": 8,
                 "eval_batch_size": 64, "checkpoint_every": 1, "threads": 1},
    "sweep": {"task": "phantom_oct_dme", "sensitivity_task": "phantom_cfp_glaucoma",
              "lr_classifier": [1.0e-3, 1.0e-1], "lr_encoder": [1.0e-4, 1.0e-2]},
    "saliency": {"enabled": True, "nt_samples": 2, "n_steps": 4, "internal_batch_size": 8, "threads": 1},
    "compute": {"enabled": True, "threads": 1, "task": "phantom_oct_dme", "inference": {"warmup": 1, "images": 6},
                "training": {"batch_size": 8, "warmup": 1, "steps": 2, "distinct_batches": 1}},
}
R = "results"


def targets():
    ft = [f"{R}/predictions/{p}/{e}/phantom_oct_dme.parquet" for p in ("finetune", "linear_aug") for e in MICRO]
    return [f"{R}/metrics.parquet", f"{R}/compute/finetune.parquet", f"{R}/sweep/lr_sweep_metrics.parquet",
            f"{R}/sweep/lr_sensitivity.parquet", *ft, f"{R}/figures/saliency/phantom_oct_dme.png",
            f"{R}/compute/benchmark.parquet", f"{R}/figures/compute/train_time.png"]


def job_counts(stdout: str) -> dict[str, int]:
    if "Job stats:" not in stdout:
        return {}
    counts = {}
    for ln in stdout.split("Job stats:")[1].splitlines()[3:]:  # the table: header, rule, dashes, then rows
        if not ln.strip():
            break
        name, n = ln.split()
        counts[name] = int(n)
    return counts


# The analysis outputs of fine-tuning, requested by the same run (not by targets(): the rerun test counts jobs).
ANALYSIS = [f"{R}/analysis/ft_lp_gap.csv", f"{R}/analysis/lr_sensitivity.csv", f"{R}/analysis/lr_transfer.csv",
            f"{R}/analysis/lr_signed_rank_distance.csv", f"{R}/figures/lr_transfer.png", f"{R}/figures/srd_lr.png"]


@pytest.fixture(scope="module")
def ft_workflow(tmp_path_factory, make_workflow_copy, run_snakemake):
    work = make_workflow_copy(tmp_path_factory.mktemp("ftwf") / "repo", FT_TINY)
    reg = work / "config/encoders.yaml"
    reg.write_text(reg.read_text() + "\n" + yaml.safe_dump(MICRO))
    run_snakemake(work, "--rerun-incomplete", *targets(), *ANALYSIS)  # a flag first: --configfile would eat targets
    return work


def test_runs_to_completion_with_both_protocols(ft_workflow):
    r = ft_workflow / R
    metrics = read_table(r / "metrics.parquet", "metrics")
    ft = metrics[metrics["protocol"].isin(["finetune", "linear_aug"])]
    assert set(ft["protocol"]) == {"finetune", "linear_aug"} and set(ft["encoder"]) == set(MICRO)
    assert set(ft["regime"]) == {"u-u", "u-b"} and set(ft["task"]) == {"phantom_oct_dme"}
    assert {"knn", "linear", "logreg"} <= set(metrics["protocol"])
    compute = pd.read_parquet(r / "compute/finetune.parquet")
    assert len(compute) == 2 * 2 and (compute["seconds_per_step"] > 0).all() and (compute["peak_mem_mb"] > 0).all()
    log = read_table(r / "training_logs/finetune/vit_micro_random/phantom_oct_dme/seed0.parquet", "training_log")
    assert len(log) == 2
    preds = read_table(r / "predictions/linear_aug/resnet_micro_random/phantom_oct_dme.parquet", "predictions")
    assert {"p_no", "p_yes"} <= set(preds.columns)
    assert not [p for p in (r / "checkpoints").rglob("*") if p.is_file()]  # removed once the outputs exist
    sidecar = json.loads((r / "predictions/finetune/vit_micro_random/phantom_oct_dme/seed0.parquet.prov.json")
                         .read_text())
    assert f"{R}/sweep/vit_micro_random/chosen.json" in [i["path"] for i in sidecar["inputs"]]


def test_sweep_picks_the_lowest_validation_loss(ft_workflow):
    r = ft_workflow / R
    for enc in MICRO:
        chosen = json.loads((r / f"sweep/{enc}/chosen.json").read_text())
        runs1 = pd.read_parquet(r / f"sweep/{enc}/phantom_oct_dme/stage1_runs.parquet")
        runs2 = pd.read_parquet(r / f"sweep/{enc}/phantom_oct_dme/stage2_runs.parquet")
        per_lr = runs1.groupby("lr")["best_val_loss"].mean()
        assert chosen["lr_classifier"] == per_lr[per_lr == per_lr.min()].index.min()
        assert set(runs2["lr_classifier"]) == {chosen["lr_classifier"]}
        assert chosen["lr_encoder"] == choose_lr(runs2)[0]
        compute = pd.read_parquet(r / f"compute/finetune/{enc}/phantom_oct_dme/seed0.parquet")
        assert compute["lr_classifier"].tolist() == [chosen["lr_classifier"]]
    sens = pd.read_parquet(r / "sweep/lr_sensitivity.parquet")
    assert list(sens.columns) == SENSITIVITY_COLUMNS
    assert set(sens["task"]) == {"phantom_oct_dme", "phantom_cfp_glaucoma"} and set(sens["encoder"]) == set(MICRO)
    sweep = pd.read_parquet(r / "sweep/lr_sweep_metrics.parquet")
    assert {"lr", "lr_name", "stage"} <= set(sweep.columns) and set(sweep["split"]) == {"val", "test"}


def test_editing_one_encoders_sweep_reruns_its_sweep_and_finetuning_only(ft_workflow, tmp_path, run_snakemake):
    again = run_snakemake(ft_workflow, "-n", *targets())
    assert "Nothing to be done" in again.stdout + again.stderr
    work = tmp_path / "repo"
    shutil.copytree(ft_workflow, work, symlinks=True)

    def plan():
        changed = {p for p in run_snakemake(work, "--list-changes", "params").stdout.split() if p.endswith(".parquet")}
        return changed, Counter(job_counts(run_snakemake(work, "-n", *targets()).stdout))

    # Baseline right before the edit: empty, unless package code changed since the run (shared checkouts).
    changed0, jobs0 = plan()
    cfg_path = work / "config/tiny.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["sweep"]["encoders"] = {"vit_micro_random": {"lr_encoder": [1.0e-4, 1.0e-3]}}
    cfg_path.write_text(yaml.safe_dump(cfg))
    changed, jobs = plan()
    # Snakemake names one output per job whose params changed: the stage-2 sweep jobs of vit_micro, both tasks.
    new = changed - changed0
    assert {(str(Path(p).parent), Path(p).name.split("_")[0]) for p in new} == {
        (f"{R}/sweep/vit_micro_random/{t}", "stage2") for t in ("phantom_oct_dme", "phantom_cfp_glaucoma")}, new
    jobs = dict(jobs - jobs0)
    assert jobs.pop("sweep_finetune") == 2 and jobs.pop("sweep_choose") == 1 and jobs.pop("sweep_sensitivity") == 1
    # vit_micro × 2 protocols (seed 0 of the saliency task: the fine-tuning jobs that keep their weights)
    assert jobs.pop("finetune_keep_weights") == 2 and jobs.pop("finetune_predictions") == 2
    assert jobs.pop("saliency") == 1 and jobs.pop("figure_saliency") == 1  # vit_micro's maps alone, then the figure
    assert jobs.pop("sweep_collect") == 1 and jobs.pop("finetune_compute") == 1 and jobs.pop("collect_metrics") == 1
    assert jobs.pop("total") == 13 and jobs == {}, jobs  # nothing of resnet_micro, no frozen / features / compute job


def test_saliency_maps_of_the_fine_tuned_models_with_provenance(ft_workflow):
    import numpy as np
    from retinabench.hashing import sha256_file
    from retinabench.provenance import read_sidecar
    from retinabench.saliency import SALIENCY_COLUMNS, read_maps
    r = ft_workflow / R
    png = r / "figures/saliency/phantom_oct_dme.png"
    assert png.stat().st_size > 5_000 and png.with_suffix(".pdf").is_file()
    ids = {}
    for enc in MICRO:
        table = pd.read_parquet(r / f"saliency/{enc}/phantom_oct_dme.parquet")
        assert list(table.columns) == SALIENCY_COLUMNS
        assert set(table["protocol"]) == {"finetune", "linear_aug"} and set(table["class"]) == {"no", "yes"}
        maps = read_maps(r / f"saliency/{enc}/phantom_oct_dme.npz")
        assert maps["clahe"].shape == (2, 2, 64, 64) and 0 <= maps["clahe"].min() and maps["clahe"].max() <= 1
        assert np.abs(maps["attribution"]).sum() > 0
        for row in table.drop_duplicates("protocol").itertuples():
            weights = ft_workflow / row.weights
            assert sha256_file(weights) == row.weights_sha256  # the file the maps came from, as recorded
            assert (weights.parent / (weights.name + ".sha256")).read_text().split()[0] == row.weights_sha256
        ids[enc] = list(table["image_id"])
        split = read_table(r / "splits/phantom/phantom_oct_dme.parquet", "split").set_index("image_id")
        assert (split.loc[table["image_id"], "split"] == "test").all()
    assert ids[list(MICRO)[0]] == ids[list(MICRO)[1]]  # the same test images in every row of the figure
    side = read_sidecar(png)
    assert set(side["extra"]["checkpoint_sha256"]) == {f"{e}/{p}" for e in MICRO for p in ("finetune", "linear_aug")}
    assert side["extra"]["image_ids"] == sorted(set(ids[list(MICRO)[0]]))
    job = read_sidecar(r / "saliency/vit_micro_random/phantom_oct_dme.parquet")
    assert job["config"]["saliency"]["nt_samples"] == 2 and job["extra"]["libraries"]["captum"]
    assert f"{R}/models/finetune/vit_micro_random/phantom_oct_dme/seed0.pt" in [i["path"] for i in job["inputs"]]


def test_compute_benchmark_table_and_figures(ft_workflow):
    from retinabench.compute import COMPUTE_COLUMNS
    from retinabench.figures.compute import FIGURES
    r = ft_workflow / R
    table = pd.read_parquet(r / "compute/benchmark.parquet")
    assert list(table.columns) == COMPUTE_COLUMNS
    assert set(zip(table["encoder"], table["phase"])) == {(e, p) for e in MICRO
                                                          for p in ("inference", "finetune", "linear_aug")}
    assert (table["task"] == "phantom_oct_dme").all() and set(table["device"]) == {"cpu"}
    assert table.set_index("phase").loc["inference", "n_timed"].tolist() == [6, 6]
    assert (table["seconds_median"] > 0).all() and (table["peak_mem_mb"] > 0).all() and (table["gflops"] > 0).all()
    for f in FIGURES:
        assert (r / f"figures/compute/{f}.png").stat().st_size > 5_000 and (r / f"figures/compute/{f}.pdf").is_file()


def test_fine_tuning_analyses_use_the_papers_protocols(ft_workflow):
    r = ft_workflow / R
    gap = pd.read_csv(r / "analysis/ft_lp_gap.csv")
    # FT - LP gap against the paper's linear probe (linear_aug), not the cached-feature probe
    assert {"finetune", "linear_aug"} <= set(gap.columns) and "linear" not in gap.columns
    assert set(gap["encoder"]) == set(MICRO)
    metrics = read_table(r / "metrics.parquet", "metrics")
    m = metrics[(metrics["metric"] == "accuracy") & (metrics["split"] == "test") & (metrics["regime"] == "u-u")]
    lp = m[m["protocol"] == "linear_aug"].groupby("encoder")["value"].mean()
    assert gap.set_index("encoder")["linear_aug"].to_dict() == pytest.approx(lp.to_dict(), abs=1e-5)
    # learning-rate sensitivity on the sweep task alone; the other swept task is the transfer check
    sens = pd.read_csv(r / "analysis/lr_sensitivity.csv")
    assert set(sens["tasks"]) == {"phantom_oct_dme"} and set(sens["size_class"]) == {"tiny"}
    transfer = pd.read_csv(r / "analysis/lr_transfer.csv")
    assert set(transfer["task"]) == {"phantom_oct_dme", "phantom_cfp_glaucoma"} and set(transfer["split"]) == {"val"}
    assert set(transfer["lr_name"]) == {"lr_classifier", "lr_encoder"} and set(transfer["encoder"]) == set(MICRO)
    chosen = {e: json.loads((r / f"sweep/{e}/chosen.json").read_text()) for e in MICRO}
    for (enc, lr_name), g in transfer.groupby(["encoder", "lr_name"]):
        assert set(g["lr_chosen"]) == {chosen[enc][lr_name]}
    srd = pd.read_csv(r / "analysis/lr_signed_rank_distance.csv")
    assert set(srd["reference"]) == {"optimal lr"} and set(srd["comparison"]) == {"sub-optimal lr"}
    assert (r / "figures/lr_transfer.png").stat().st_size > 10_000


def test_fine_tuning_figures_are_drawn_within_the_print_targets(ft_workflow, tmp_path, figure_checks):
    render, check = figure_checks
    saved = render(ft_workflow, tmp_path, families={"ft_lp", "sensitivity", "lr_transfer"}, reliability=False)
    check(saved, {"ft_lp_gap", "lr_sensitivity", "srd_lr", "lr_transfer"})


def test_fine_tuning_jobs_log_progress_with_an_eta(ft_workflow):
    logs = ft_workflow / R / "logs"
    for pattern, needle in (("finetune/*/*/*/seed*.log", "[progress] finetune seed"),
                            ("finetune/*/*/*/seed*.log", "[progress] linear_aug seed"),
                            ("sweep/*/*/stage1.log", "[progress] sweep stage 1"),
                            ("sweep/*/*/stage2.log", "[progress] sweep stage 2")):
        files = sorted(logs.glob(pattern))
        assert files, pattern
        hits = [f for f in files if needle in f.read_text()]
        assert hits, (pattern, needle, files[0].read_text()[-800:])
        for f in hits:
            lines = [ln for ln in f.read_text().splitlines() if ln.startswith(needle)]
            assert all("ETA" in ln and "elapsed" in ln for ln in lines), lines
            assert "(100%)" in lines[-1], lines[-1]  # the last epoch / run is reported
    for f in sorted(logs.rglob("*.log")):
        last = f.read_text().strip().splitlines()[-1]
        assert last.startswith("[done] "), (f, last)
