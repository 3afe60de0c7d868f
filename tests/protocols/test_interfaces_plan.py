"""Job planning of the two prompt-based interfaces (torch-free): one job per (registry entry, task set) per
interface on one GPU, over FOCUS's grid; tasks no prompt set covers are listed with the reason, not dropped."""
from pathlib import Path

import pytest
import yaml

from retinabench.prompts import load_prompts
from retinabench.plan.interface_jobs import job_resources, plan_jobs
from retinabench.protocols.interfaces import INTERFACES
from retinabench.plan.selection import plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def focus(registries):
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.update(yaml.safe_load((REPO / "config/focus.yaml").read_text()))
    config["registries"] = {k: str(REPO / v) for k, v in config["registries"].items()}
    p = plan(config)
    return {t: registries.task(t) for t in p.tasks}, registries.encoders, load_prompts(REPO / "config/prompts.yaml")


def test_one_job_per_model_and_task_set_for_each_interface_over_the_focus_grid(focus):
    tasks, encoders, prompts = focus
    assert len(tasks) == 18
    zs, skipped = plan_jobs("zeroshot", encoders, tasks, prompts)
    assert skipped.empty  # FOCUS's harmonised tasks all have zero-shot prompts
    names = {j.encoder for j in zs}
    assert {"clip_vitb32_openai", "clip_vitl14_openai", "siglip2_base_patch16_224", "medsiglip_448",
            "eyeclip", "ret_clip", "flair"} <= names and "gemma3_27b_it" not in names
    assert all(j.task_set == "all" and len(j.tasks) == 18 and len(j.datasets) == 10 for j in zs)
    ml, skipped = plan_jobs("mllm", encoders, tasks, prompts)
    assert skipped.empty and len(ml) == 6 and {j.encoder for j in ml} == {
        "gemma3_27b_it", "medgemma_4b_it", "medgemma_1_5_4b_it", "llava_next_llama3_8b", "qwen3_vl_8b_instruct",
        "medgemma_27b_it"}
    for j in zs + ml:
        assert j.resources["gpu"] == 1  # routed to the GPU partition by the Slurm profile
        assert j.predictions_path("results") == f"results/predictions/{j.interface}/{j.encoder}/all.parquet"
        assert j.metrics_path("results") == f"results/metrics/{j.interface}/{j.encoder}/all.parquet"
    # an MLLM generates once per prompt set; a dual encoder embeds its images once
    g = encoders["gemma3_27b_it"]
    assert job_resources(g, 10, 3)["runtime"] == 3 * job_resources(g, 10, 1)["runtime"]
    c = encoders["clip_vitb32_openai"]
    assert job_resources(c, 10, 3) == job_resources(c, 10, 1)


def test_task_sets_selection_and_uncovered_tasks(focus):
    tasks, encoders, prompts = focus
    first = sorted(tasks)[:3]
    jobs, _ = plan_jobs("mllm", encoders, tasks, prompts, names=["medgemma_4b_it"],
                        task_sets={"a": first, "b": sorted(tasks)[3:]})
    assert [(j.encoder, j.task_set, len(j.tasks)) for j in jobs] == [("medgemma_4b_it", "a", 3),
                                                                     ("medgemma_4b_it", "b", 15)]
    other = dict(tasks, x_task=dict(tasks[first[0]], name="x_task", harmonised="no_such"))
    jobs, skipped = plan_jobs("zeroshot", encoders, other, prompts, names=["eyeclip"])
    assert skipped[["task", "interface"]].values.tolist() == [["x_task", "zeroshot"]]
    assert "no zeroshot prompt set covers it" in skipped["reason"].item() and len(jobs[0].tasks) == 18
    with pytest.raises(KeyError, match="vilref.*Chinese BERT"):  # an image tower only: its note says why
        plan_jobs("zeroshot", encoders, tasks, prompts, names=["vilref"])
    with pytest.raises(KeyError, match="not in the task registry"):
        plan_jobs("zeroshot", encoders, tasks, prompts, task_sets={"a": ["nope"]})
    assert set(INTERFACES) == {"zeroshot", "mllm"}
