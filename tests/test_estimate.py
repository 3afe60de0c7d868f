"""`retinabench estimate`: job counts equal the plan's on both paper configs (no data: declared sizes), a
measured throughput row overrides the parameter-count assumption for its encoder, the assumptions are printed."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from retinabench.cli import _load_config, main
from retinabench.estimate import Assumptions, before_launch, estimate
from retinabench.estimate.model import forward_flops
from retinabench.plan import WorkflowPlan
from retinabench.regimes import train_sides


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = {}
    for name in ("ocularbench", "focus"):
        results = tmp_path_factory.mktemp(name)
        out[name] = WorkflowPlan(_load_config([f"config/{name}.yaml"], [f"results={results}"]))
    return out


def _jobs(est) -> dict[str, int]:
    return {s: t["jobs"] for s, t in est.stage_totals().items()}


def _plan_jobs(p) -> dict[str, int]:
    ft = p.finetune
    want = {"features": len(p.encoders) * len(p.datasets), "frozen": len(p.encoders) * len(p.tasks)}
    if ft.on:
        want["finetune"] = len(ft.grid())
    if ft.sweep_on:
        want["sweep"] = sum(len(ft.encoder_sweep_tasks(e)) for e in ft.encoders) * len(ft.stages)
    for interface, _, _ in p.interfaces.jobs:
        want[interface] = want.get(interface, 0) + 1
    if p.lora.jobs:
        want["lora_train"] = want["lora_infer"] = len(p.lora.jobs)
    if p.saliency.on:
        want["saliency"] = len(p.saliency.encoders) * len(p.saliency.tasks)
    if p.compute.on:
        want["compute"] = len(p.compute.encoders)
    return want


@pytest.mark.parametrize("name", ["ocularbench", "focus"])
def test_job_counts_equal_the_plan(plans, name):
    p = plans[name]
    est = estimate(p, Assumptions())
    assert _jobs(est) == _plan_jobs(p)
    assert est.gpu_hours > 0
    # no data here: every image count is a declared size or a stated assumption, never a manifest
    assert {s.split(" (")[0] for _, s in est.images.values()} <= {"declared", "assumed"}
    assert all(r["gpu_hours"] == 0 for r in est.rows if r["stage"] == "frozen")


def test_paper_grids_as_the_papers_count(plans):
    ocular, focus = (_jobs(estimate(plans[n], Assumptions())) for n in ("ocularbench", "focus"))
    assert ocular["finetune"] == 2 * 33 * 39 * 3  # finetune + linear_aug x encoders x tasks x seeds
    assert focus["mllm"] == 6 and focus["lora_train"] == 30  # 6 MLLMs; 36 adapters less mBRSET's GON (6)


def test_a_features_job_is_the_stated_formula(plans):
    p, a = plans["focus"], Assumptions()
    est = estimate(p, a)
    e = p.encoders[0]
    images = sum(est.images[d][0] for d in p.datasets)
    work = forward_flops(p.reg.encoder(e), a) * images / (a.sustained_tflops * 1e12)
    want = (work * (1 + a.data_overhead) + a.startup_s * len(p.datasets)) / 3600
    row = next(r for r in est.rows if r["stage"] == "features" and r["encoder"] == e)
    assert row["gpu_hours"] == pytest.approx(want) and row["source"] == "params; images declared"


def test_measured_throughput_overrides_the_assumption(plans):
    p, a = plans["ocularbench"], Assumptions()
    before = {(r["stage"], r["encoder"]): r for r in estimate(p, a).rows}
    enc, other = p.finetune.encoders[0], p.finetune.encoders[1]
    bench = pd.DataFrame({"encoder": [enc, enc], "phase": ["finetune", "linear_aug"], "images_per_s": [50.0, 400.0],
                          "device_name": ["NVIDIA H100 80GB HBM3"] * 2})
    path = p.path("compute_table")
    import os
    os.makedirs(os.path.dirname(path), exist_ok=True)
    bench.to_parquet(path)
    try:
        after = {(r["stage"], r["encoder"]): r for r in estimate(p, a).rows}
    finally:
        os.remove(path)
    assert after[("finetune", enc)]["source"].startswith("measured: compute benchmark (1 rows, NVIDIA H100")
    assert after[("features", enc)]["source"].startswith("measured")  # forward = 3 x the measured training rate
    assert after[("finetune", enc)]["gpu_hours"] != pytest.approx(before[("finetune", enc)]["gpu_hours"])
    assert after[("finetune", other)] == before[("finetune", other)]
    # the measured rate is what the hours are made of: the training images of one job at 50 images/s (fine-tuning)
    ft = p.finetune
    runs = len(train_sides(ft.regimes))
    trained = runs * ft.settings.epochs * ft.settings.steps_per_epoch * ft.settings.batch_size
    per_job = [trained / 50.0, trained / 400.0]  # finetune, linear_aug: training alone, a lower bound
    n_jobs = after[("finetune", enc)]["jobs"] // 2
    assert after[("finetune", enc)]["gpu_hours"] * 3600 > n_jobs * sum(per_job)


def test_cli_prints_the_assumptions_and_overrides(tmp_path, capsys):
    args = ["estimate", "--configfile", "config/focus.yaml", "--config", f"results={tmp_path}"]
    assert main(args + ["--gpu", "gh200"]) == 0
    out = capsys.readouterr().out
    assert "assumptions (override with --set KEY=VALUE):" in out
    assert "gpu gh200: 395.6 sustained bf16 TFLOP/s" in out and "start-up 60 s per job" in out
    assert "dataset brset_diabetic: 16266 images (declared (brset, upper bound))" in out
    assert main(args + ["--json", "--set", "startup_s=0", "tflops=h100:100"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["assumptions"]["startup_s"] == 0 and data["assumptions"]["tflops"]["h100"] == 100
    assert data["totals"]["jobs"] == sum(r["jobs"] for r in data["rows"])
    assert main(args + ["--set", "nonsense=1"]) == 2
    assert "expected KEY=VALUE with KEY one of" in capsys.readouterr().err
    assert main(args + ["--gpu", "a100"]) == 2


def test_before_launch_writes_and_prints(plans, capsys):
    p = plans["focus"]
    path = before_launch(p, gpu="h200")
    text = open(path).read()
    assert text.rstrip().endswith("on h200") and "per stage:" in text
    assert "retinabench: estimate of this run" in capsys.readouterr().err


def test_a_failing_estimate_warns_and_never_stops_the_launch(plans, capsys, monkeypatch):
    import retinabench.estimate as E

    def broken(*_a, **_k):
        raise KeyError("no size for dataset x")
    monkeypatch.setattr(E, "estimate", broken)
    assert before_launch(plans["focus"], gpu="h100") == ""
    assert "WARNING: no cost estimate for this run (KeyError" in capsys.readouterr().err
