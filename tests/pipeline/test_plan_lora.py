"""LoRA SFT in the plan: off by default; one training job per (MLLM, source task) with `lora.gpus` GPUs, one
inference job per adapter (1 GPU) on its source task and every grid task sharing its harmonised id, one deltas job
reading the adapters' and the base model's predictions; start-up problems when the base model has no result to
pair with; settings and schema agree."""
from pathlib import Path

import pytest
import yaml

from retinabench.plan import WorkflowPlan
from retinabench.plan.code import rule_code_files
from retinabench.settings import ConfigError

REPO = Path(__file__).resolve().parents[2]
MLLM = "medgemma_4b_it"
GON = ["phantom_cfp_glaucoma", "phantom_siteb_cfp_glaucoma"]


def config(**sections):
    c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    c["registries"] = {k: str(REPO / v) for k, v in c["registries"].items()}
    c.update(sections)
    return c


def lora_config(lora=None, mllm=None, tasks=None):
    return config(tasks=tasks or [*GON, "phantom_cfp_dr3"],
                  mllm={"enabled": True, "encoders": [MLLM], **(mllm or {})},
                  lora={"enabled": True, "sources": ["phantom_cfp_glaucoma"], **(lora or {})})


def test_lora_is_off_by_default_and_its_section_agrees_with_the_schema():
    p = WorkflowPlan(config())
    assert p.lora.jobs == {} and p.lora.targets() == [] and p.lora.problems() == []
    from retinabench.settings import LoraSection
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())["$defs"]
    assert set(schema["LoraSection"]["properties"]) == set(LoraSection.model_fields)
    assert set(schema["LoraDeltas"]["properties"]) == set(LoraSection().deltas.plain())
    from retinabench.protocols.lora_launch import train_job
    from retinabench.protocols.registry import PROTOCOLS
    spec = PROTOCOLS.get("mllm_lora")
    assert spec.kind == "images" and spec.family == ("mllm_lora", "mllm_lora_renorm") and spec.job() is train_job
    assert spec.settings({"lora": {"gpus": 2}}).gpus == 2 and spec.settings({}).deltas.unit == "patient"
    with pytest.raises(ConfigError, match="lora.gpu: unknown key; did you mean 'lora.gpus'"):
        spec.settings({"lora": {"gpu": 2}})


def test_one_training_job_per_mllm_and_source_tested_in_and_out_of_domain():
    p = WorkflowPlan(lora_config())
    lp = p.lora
    assert sorted(lp.jobs) == [(MLLM, "phantom_cfp_glaucoma")]
    job = lp.jobs[(MLLM, "phantom_cfp_glaucoma")]
    # the source task first (in-domain), then every grid task of the same harmonised id (gon); not DR grading
    assert job.test_tasks == tuple(GON)

    class WC:
        encoder, task = MLLM, "phantom_cfp_glaucoma"
    assert lp.train_resource("gpu")(WC) == 4 and lp.infer_resource("gpu")(WC) == 1
    # host memory: four bf16 copies of the base model while the processes load it (4.3 B params: > 50 GB)
    params_m = p.reg.encoder(MLLM)["params_m"]
    assert lp.train_resource("mem_mb")(WC) == max(96000, int(4 * params_m * 3)) >= lp.infer_resource("mem_mb")(WC)
    inputs = lp.train_inputs(WC)
    assert inputs["split"].endswith("splits/phantom/phantom_cfp_glaucoma.parquet")  # the training split's table
    assert lp.train_params(WC)["task"]["name"] == "phantom_cfp_glaucoma"
    infer = lp.infer_inputs(WC)
    assert infer["adapter"] == f"{p.R}/lora/{MLLM}/phantom_cfp_glaucoma/adapter"
    assert len(infer["splits"]) == 2 and {"array_phantom", "array_phantom_siteb"} <= set(infer)
    # the deltas read the adapter's predictions and the base model's mllm predictions holding both test tasks
    base = lp.base_predictions(MLLM, "phantom_siteb_cfp_glaucoma")
    assert base == p.interfaces.jobs[("mllm", MLLM, "all")].predictions_path(p.R)
    assert lp.delta_inputs()["base"] == [base]
    assert lp.delta_inputs()["adapters"] == [f"{p.R}/predictions/mllm_lora/{MLLM}/phantom_cfp_glaucoma.parquet"]
    assert set(lp.delta_outputs().values()) <= set(p.all_targets()) and lp.prediction_files()
    # the only start-up problem: the real registry's MLLM has no lock record here
    problems = lp.problems()
    assert problems and all(MLLM in q for q in problems) and not any("pair with" in q for q in problems)


def test_sources_are_task_names_or_patterns_and_explicit_test_tasks_are_filtered_to_the_same_task():
    p = WorkflowPlan(lora_config(lora={"sources": ["phantom*_glaucoma"], "test_tasks": [*GON, "phantom_cfp_dr3"]}))
    assert sorted(t for _, t in p.lora.jobs) == GON
    # phantom_cfp_dr3 is not the same task: never an adapter's test set
    assert p.lora.jobs[(MLLM, "phantom_siteb_cfp_glaucoma")].test_tasks == tuple(reversed(GON))
    with pytest.raises(KeyError, match="matches no task"):
        WorkflowPlan(lora_config(lora={"sources": ["brset_*"]}))
    with pytest.raises(ValueError, match="binary"):
        WorkflowPlan(lora_config(lora={"sources": ["phantom_cfp_dr3"]}))
    with pytest.raises(ValueError, match="names no source"):
        WorkflowPlan(lora_config(lora={"sources": []}))
    with pytest.raises(ConfigError, match="lora.train.rank: unknown key; known keys of lora.train: r, alpha"):
        WorkflowPlan(lora_config(lora={"train": {"rank": 8}}))
    with pytest.raises(ConfigError, match="lora.deltas.nboot: unknown key; did you mean .lora.deltas.n_boot."):
        WorkflowPlan(lora_config(lora={"deltas": {"nboot": 1000}}))


def test_missing_base_results_stop_the_start_up_naming_what_to_enable():
    # the base mllm job covers only the source task: the out-of-domain test has nothing to pair with
    p = WorkflowPlan(lora_config(mllm={"task_sets": {"src": ["phantom_cfp_glaucoma"]}}))
    problems = p.lora.problems()
    assert any("tested on phantom_siteb_cfp_glaucoma" in q and "pair with" in q for q in problems), problems
    # the adapters' prompt set (the registry default, focus) left out of the base runs
    p = WorkflowPlan(lora_config(mllm={"prompt_sets": ["plain"]}))
    assert any("prompt set 'focus'" in q for q in p.lora.problems())
    p = WorkflowPlan(lora_config(mllm={"prompt_sets": ["plain"]}, lora={"train": {"prompt_set": "plain"}}))
    assert not any("prompt set" in q for q in p.lora.problems())


def test_rule_code_covers_the_lora_modules_and_the_stages_are_registered():
    from retinabench.pipeline.stages import STAGES
    for rule in ("mllm_lora_train", "mllm_lora_infer", "mllm_lora_deltas"):
        assert rule in STAGES
    train = {f.name for f in rule_code_files("mllm_lora_train")}
    assert {"lora.py", "lora_launch.py", "mllm.py"} <= train
    deltas = {f.name for f in rule_code_files("mllm_lora_deltas")}
    assert {"adapter_deltas.py", "paired.py"} <= deltas and "lora_launch.py" not in deltas


def test_the_focus_grid_trains_on_brset_and_mbrset_and_tests_every_dataset_of_the_task():
    c = config()
    c.update(yaml.safe_load((REPO / "config/focus.yaml").read_text()))
    c["registries"] = {k: str(REPO / v) for k, v in c["registries"].items()}
    lp = WorkflowPlan(c).lora
    mllms = {e for e, _ in lp.jobs}
    assert len(mllms) == 6 and {t for _, t in lp.jobs} == {
        "brset_diabetic_cfp_anydr", "brset_diabetic_cfp_referable", "brset_diabetic_cfp_gon",
        "mbrset_macula_cfp_anydr", "mbrset_macula_cfp_referable"}
    in_domain = len(lp.jobs)
    out_of_domain = sum(len(j.test_tasks) - 1 for j in lp.jobs.values())
    assert (in_domain, out_of_domain) == (30, 162)  # FOCUS: 36 + 192 (mBRSET's GON, which the release lacks)
    gon = lp.jobs[("medgemma_4b_it", "brset_diabetic_cfp_gon")].test_tasks
    assert gon == ("brset_diabetic_cfp_gon", "papila_cfp_gon_focus", "refuge_cfp_gon", "g1020_cfp_gon")
    # every test task has the base model's result (the mllm interface runs all 18 tasks)
    assert not [q for q in lp.problems() if "pair with" in q]
