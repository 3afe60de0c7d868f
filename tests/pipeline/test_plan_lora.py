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


def focus_plan():
    c = config()
    c.update(yaml.safe_load((REPO / "config/focus.yaml").read_text()))
    c["registries"] = {k: str(REPO / v) for k, v in c["registries"].items()}
    return WorkflowPlan(c).lora


def test_the_focus_grid_plans_focus_36_in_domain_and_192_out_of_domain_evaluations():
    # FOCUS (config/mllm_config.yaml, jobs/eval/evaluate_sft_adapters.sh): 6 MLLMs x {brset, mbrset} x {binary_dr,
    # referable_dr, glaucoma}, each adapter tested on every eval dataset of its task: DR 7 datasets, GON 5
    lp = focus_plan()
    mllms = {e for e, _ in lp.jobs}
    assert len(mllms) == 6 and {t for _, t in lp.jobs} == {
        "brset_diabetic_cfp_anydr", "brset_diabetic_cfp_referable", "brset_diabetic_cfp_gon",
        "mbrset_macula_cfp_anydr", "mbrset_macula_cfp_referable"}
    n = lp.counts()
    assert (n["in_domain"], n["out_of_domain"]) == (36, 192)
    # of which this grid runs 30 + 162; mBRSET GON (no label in its release) is lora.unavailable; RFMiD /
    # RFMiD 2.0 referable DR run as FOCUS's flagged approximations (label_variant focus)
    assert (n["in_domain_run"], n["out_of_domain_run"]) == (30, 162)
    assert n["in_domain_run"] == len(lp.jobs) and n["out_of_domain_run"] == sum(len(j.test_tasks) - 1
                                                                                 for j in lp.jobs.values())
    per_source = {}
    for j in lp.jobs.values():
        per_source[j.source] = len(j.test_tasks) - 1 + sum(1 for q in lp.not_run if q.encoder == j.encoder
                                                           and q.source == j.source)
    assert per_source == {"brset_diabetic_cfp_anydr": 6, "brset_diabetic_cfp_referable": 6,
                          "brset_diabetic_cfp_gon": 4, "mbrset_macula_cfp_anydr": 6, "mbrset_macula_cfp_referable": 6}
    virtual = [q for q in lp.not_run if q.source == "mbrset_macula/gon"]
    assert len(virtual) == 6 * 5 and sum(q.in_domain for q in virtual) == 6
    gon = lp.jobs[("medgemma_4b_it", "brset_diabetic_cfp_gon")].test_tasks
    assert gon == ("brset_diabetic_cfp_gon", "papila_cfp_gon_focus", "refuge_cfp_gon", "g1020_cfp_gon")
    rows = lp.skipped()
    assert sum(r["n"] for r in rows) == 6 + 30 and all("cannot run" in r["reason"] for r in rows)
    assert any("increased_cdr" in r["reason"] and r["part"] == "mbrset_macula/gon -> mbrset_macula/gon" for r in rows)
    # ... and they reach the skipped-analyses table's planned rows
    planned = lp.core.analysis.skipped_params()["planned"]
    assert [r for r in planned if r["output"] == "lora_table5" and "cannot run" in r["reason"]] == rows
    # every test task has the base model's result (the mllm interface runs all 18 tasks)
    assert not [q for q in lp.problems() if "pair with" in q]
    t = lp.train
    assert (t.targets, t.modules_to_save, t.label_mask, t.effective_batch) == (
        "all_linear", "focus", "full", "per_process")


def test_unavailable_entries_are_checked_against_the_grid():
    base = {"sources": ["phantom_cfp_glaucoma"]}
    p = WorkflowPlan(lora_config(lora={**base, "unavailable": {"phantom_sitec": {"gon": "no such site here"}}}))
    n = p.lora.counts()
    # the adapter is also planned on the missing site (not run); the site is no source (not a source dataset)
    assert (n["in_domain"], n["out_of_domain"], n["out_of_domain_not_run"]) == (1, 2, 1)
    with pytest.raises(ValueError, match=r"lora.unavailable.phantom_siteb.gon: the grid runs it"):
        WorkflowPlan(lora_config(lora={**base, "unavailable": {"phantom_siteb": {"gon": "x"}}}))
    with pytest.raises(KeyError, match="harmonised id of no grid task"):
        WorkflowPlan(lora_config(lora={**base, "unavailable": {"phantom_sitec": {"amd": "x"}}}))
    with pytest.raises(ValueError, match="give the reason"):
        WorkflowPlan(lora_config(lora={**base, "unavailable": {"phantom_sitec": {"gon": " "}}}))
    # explicit test tasks: only those (no unavailable test set is planned)
    p = WorkflowPlan(lora_config(lora={**base, "test_tasks": GON, "unavailable": {"phantom_sitec": {"gon": "x"}}}))
    assert p.lora.counts()["out_of_domain_not_run"] == 0
