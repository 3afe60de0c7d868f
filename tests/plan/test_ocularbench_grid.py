"""config/ocularbench.yaml runs the paper's sweep (AI-READI CFP, the sensitivity repeat on EyePACS balanced for
three encoders), its saliency maps (Figs. A.7-A.9) and its compute benchmark (Figs. A.16-A.19); the sweep's
sensitivity-encoder filter and per-task regimes in the plan."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from retinabench.plan import WorkflowPlan
from tests.conftest import shipped_config

REPO = Path(__file__).resolve().parents[2]
SENSITIVITY_ENCODERS = ["vit_base_patch16_in21k", "dinov2_vitb14", "siglip_so400m_patch14_384"]


def _config(*names, **overrides):
    config = shipped_config(*names)
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def ocular():
    return WorkflowPlan(_config("ocularbench"))


def test_the_sweep_runs_on_aireadi_cfp_and_the_sensitivity_repeat_on_eyepacs_balanced(ocular):
    ft = ocular.finetune
    assert (ft.sweep_task, ft.sensitivity_task) == ("aireadi_cfp_study_group", "eyepacs_cfp_dr5")
    assert ft.sensitivity_encoders == SENSITIVITY_ENCODERS
    assert ft.sweep_regimes("aireadi_cfp_study_group") == ["u-u"] and ft.sweep_regimes("eyepacs_cfp_dr5") == ["b-b"]
    swept = {(Path(f).parts[-3], Path(f).parts[-2]) for e in ft.encoders for f in ft.sweep_stage_files(e, "runs")}
    assert {t for _, t in swept} == {"aireadi_cfp_study_group", "eyepacs_cfp_dr5"}
    assert {e for e, t in swept if t == "eyepacs_cfp_dr5"} == set(SENSITIVITY_ENCODERS)
    assert {e for e, t in swept if t == "aireadi_cfp_study_group"} == set(ft.encoders) and len(ft.encoders) > 3
    # each sweep job's runs read the regimes of its task
    params = ft.sweep_params(2)
    assert params(SimpleNamespace(encoder="dinov2_vitb14", task="eyepacs_cfp_dr5"))["regimes"] == ["b-b"]
    assert params(SimpleNamespace(encoder="resnet50_random", task="aireadi_cfp_study_group"))["regimes"] == ["u-u"]


def test_fig_12_and_the_lr_transfer_figures_read_what_the_sweep_ran(ocular):
    ctx = ocular.analysis.context
    assert ctx.sweep_tasks == {"sweep": "aireadi_cfp_study_group", "check": "eyepacs_cfp_dr5", "check_regime": "b-b",
                               "check_encoders": SENSITIVITY_ENCODERS}
    targets = ocular.all_targets()
    figures = {Path(t).name for t in targets if "/figures/" in t}
    assert {"lr_sensitivity.png", "lr_transfer.png"} <= figures
    assert not any(name.startswith("lr_transfer_part") for name in figures)  # three encoders: one page


def test_saliency_and_compute_run_with_the_papers_settings(ocular):
    sal, comp = ocular.saliency, ocular.compute
    assert sal.on and sal.encoders == ["dinov2_vitb14", "retfound_mae_cfp", "virchow"]
    assert sal.protocols == ["finetune", "linear_aug"] and "aptos2019_cfp_dr5" in sal.tasks
    s = sal.settings
    assert (s.images_per_class, s.nt_samples, s.stdev, s.nt_type) == (1, 50, 0.3, "smoothgrad")
    assert comp.on and comp.task == "aptos2019_cfp_dr5"
    c = comp.settings
    assert (c.training.batch_size, c.training.steps) == (64, 25)
    assert (c.inference.batch_size, c.inference.images) == (1, None) and c.inference.warmup > 0
    # the defaults stay opt-in
    default = WorkflowPlan(_config())
    assert not default.saliency.on and not default.compute.on


def test_sensitivity_encoders_filter_the_sensitivity_jobs_only():
    demo = _config("finetune_demo")
    encoders = ["resnet18_random", "vit_tiny_random"]
    demo["finetune"] = {**demo["finetune"], "encoders": encoders}
    ft = WorkflowPlan({**demo, "sweep": {**demo["sweep"], "sensitivity_encoders": [encoders[1]],
                                         "sensitivity_regimes": ["b-b"]}}).finetune
    sens = ft.sensitivity_task
    assert sens and ft.sensitivity_encoders == [encoders[1]]
    assert [Path(f).parts[-2] for f in ft.sweep_stage_files(encoders[0], "runs")] == [ft.sweep_task] * 2
    assert [Path(f).parts[-2] for f in ft.sweep_stage_files(encoders[1], "runs")] == [ft.sweep_task] * 2 + [sens] * 2
    assert ft.sweep_regimes(sens) == ["b-b"] and ft.sweep_regimes(ft.sweep_task) == list(ft.sweep.regimes) != ["b-b"]
    # null: every fine-tuned encoder, in the sweep's regimes
    ft = WorkflowPlan(demo).finetune
    assert ft.sensitivity_encoders == encoders and ft.sweep_regimes(sens) == ft.sweep_regimes(ft.sweep_task)
    with pytest.raises(ValueError, match=r"sweep.sensitivity_encoders \['nope'\] are not fine-tuned encoders"):
        WorkflowPlan({**demo, "sweep": {**demo["sweep"], "sensitivity_encoders": ["nope"]}})


def test_the_grid_is_33_encoders_by_39_tasks_with_every_protocol_seed_and_regime(ocular):
    """The paper's grid as planned (bench/dag_scale.py --configs ocularbench --rules gives the same per-rule job
    counts from `snakemake -n`): frozen features per (encoder, dataset), one frozen job per (encoder, task) holding
    kNN and the cached probe, fine-tuning and the augmented linear probe per (encoder, task, seed), each run tested
    in the four regimes."""
    assert len(ocular.encoders) == 33 and len(ocular.tasks) == 39 and len(ocular.datasets) == 19
    assert ocular.config["protocols"] == ["knn", "linear"] and ocular.config["seeds"] == [0, 1, 2]
    assert ocular.config["regimes"] == ["u-u", "u-b", "b-b", "b-u"]
    ft = ocular.finetune
    assert ft.protocols == ["finetune", "linear_aug"] and ft.encoders == ocular.encoders and ft.tasks == ocular.tasks
    assert len(list(ft.grid())) == 2 * 33 * 39 * 3
    assert len(ft.metrics_files()) == 2 * 33 * 39 * 3
    assert len(ocular.frozen("metrics")) == 33 * 39
    assert ocular.config["input_size"] == 224
