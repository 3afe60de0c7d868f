"""The prompt-based protocols in the plan: one GPU job per (entry, task set) per enabled interface, their
predictions and metrics reach the reliability and analysis layers through the plan, unpinned entries stop the
start-up, and the registry / schema / config agree on their sections."""
from pathlib import Path

import pytest
import yaml

from retinabench.plan import WorkflowPlan
from retinabench.plan.code import rule_code_files
from retinabench.protocols.registry import PROTOCOLS
from retinabench.plan.selection import ConfigError

REPO = Path(__file__).resolve().parents[2]


def config(**sections):
    c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    c["registries"] = {k: str(REPO / v) for k, v in c["registries"].items()}
    c.update(sections)
    return c


def test_interfaces_are_off_by_default_and_their_sections_agree_with_registry_schema_and_config():
    p = WorkflowPlan(config())
    assert p.interfaces.jobs == {} and p.interfaces.targets() == []
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for name in PROTOCOLS.names("prompts"):
        spec = PROTOCOLS.get(name)
        model = spec.settings_model
        from retinabench.protocols.interfaces import INTERFACES
        assert INTERFACES[name].section is model and issubclass(model, INTERFACES[name].settings), name
        assert set(schema["$defs"][model.__name__]["properties"]) == set(model.model_fields), name
        assert c[spec.section] == spec.settings({}).plain(), name
        assert spec.family[0] == name and len(spec.family) == 2 and callable(spec.job())


def test_enabled_interfaces_plan_one_gpu_job_per_entry_and_task_set_and_feed_reliability():
    c = config(zeroshot={"enabled": True, "encoders": ["clip_vitb32_openai", "siglip2_base_patch16_224"]},
               mllm={"enabled": True, "encoders": ["medgemma_4b_it"], "prompt_sets": ["focus", "plain"]})
    p = WorkflowPlan(c)
    anydr = [t for t in p.tasks if p.reg.task(t).get("harmonised")]
    assert sorted(p.interfaces.jobs) == [("mllm", "medgemma_4b_it", "all"), ("zeroshot", "clip_vitb32_openai", "all"),
                                         ("zeroshot", "siglip2_base_patch16_224", "all")]
    job = p.interfaces.jobs[("mllm", "medgemma_4b_it", "all")]
    assert set(job.tasks) == set(anydr) and job.resources["gpu"] == 1
    from retinabench.registry.sizes import SIZE_CLASSES
    # giant class: its per-dataset runtime x datasets x 2 prompt sets (a dual encoder embeds once per dataset)
    assert job.resources["runtime"] == SIZE_CLASSES["giant"]["runtime"] * len(job.datasets) * 2
    # tasks without prompts (the phantom's DR grading, glaucoma, DME) are listed, not silently dropped
    notes = p.interfaces.notes()
    assert notes and all("no " in n and "prompt set covers it" in n for n in notes)
    assert {n.split("task ")[1].split(" ")[0] for n in notes} == set(p.tasks) - set(anydr)
    preds = p.reliability.prediction_files()
    assert preds["zeroshot/clip_vitb32_openai/all"] == f"{p.R}/predictions/zeroshot/clip_vitb32_openai/all.parquet"
    assert p.reliability.tasks_of("mllm", "all") == list(job.tasks)
    assert p.reliability.tasks_of("frozen", anydr[0]) == [anydr[0]]
    assert f"{p.R}/metrics/mllm/medgemma_4b_it/all.parquet" in p.metrics_files()
    assert f"{p.R}/interfaces/zeroshot_ece_difference.parquet" in p.all_targets()

    class WC:
        encoder, task_set = "medgemma_4b_it", "all"
    ins = p.interfaces.job_inputs("mllm", WC)
    assert ins["prompts"].endswith("config/prompts.yaml") and len(ins["splits"]) == len(job.tasks)
    assert {k for k in ins if k.startswith("array_")} == {f"array_{d}" for d in job.datasets}
    with pytest.raises(ConfigError, match=r"(?s)zeroshot / mllm: .*'clip_vitb32_openai' is not locked"):
        p.start(main_process=True)


def test_the_interface_rules_code_is_what_their_stages_import():
    from tests.pipeline.test_plan import files
    zs = files("zeroshot")
    assert {"pipeline/interfaces.py", "protocols/interfaces.py"} <= zs
    assert files("mllm") == zs  # one stage for both rules; each job function is imported from the spec
    assert "analysis/prompts.py" in files("interface_tables")
    assert rule_code_files("zeroshot", ())
