"""config/ocularbench.yaml and config/focus.yaml declare the reference studies' grids over the registries."""
from pathlib import Path

import yaml

from retinabench.data.derived import harmonised_groups, unsupported_harmonised
from retinabench.plan.selection import plan
from tests.conftest import shipped_config

REPO = Path(__file__).resolve().parents[2]


def test_ocularbench_grid_is_the_39_tasks_over_its_established_datasets(registries):
    p = plan(shipped_config("ocularbench"))
    ob = [n for n, t in registries.tasks.items() if "ocularbench" in t.get("papers", [])]
    assert len(ob) == 39 and p.tasks == ob
    families = {registries.task(t)["family"] for t in p.tasks}
    assert families == {"multi_disease", "dr_grading", "glaucoma", "retinal_pathology", "systemic_health",
                        "visual_function"}
    paper_datasets = {n for n, d in registries.datasets.items() if "ocularbench" in d.get("papers", [])}
    assert len(paper_datasets) == 21
    unestablished = {n for n in paper_datasets if registries.datasets[n].get("status") == "unestablished"}
    assert unestablished == {"fimd", "ouwwfi"} and set(p.datasets) == paper_datasets - unestablished


def test_focus_grid_is_its_10_datasets_and_harmonised_tasks_with_every_gap_explained(registries):
    config = shipped_config("focus")
    p = plan(config)
    assert len(p.datasets) == 10 and all(registries.task(t).get("harmonised") for t in p.tasks)
    # the grid's encoders are the registry's FOCUS image encoders (vision models and the VLMs' image towers)
    focus_features = {n for n, e in registries.encoders.items() if "focus" in (e.get("studies") or [])
                      and "features" in (e.get("interfaces") or ["features"]) and "variant_of" not in e}
    assert set(p.encoders) == focus_features and len(p.encoders) == 16
    groups = harmonised_groups({t: registries.task(t) for t in p.tasks})
    assert {g: len(v) for g, v in groups.items()} == {"any_dr_cfp": 7, "referable_dr_cfp": 7, "gon_cfp": 4}
    catalogue = config["reliability"]["harmonised"]
    gaps = unsupported_harmonised(catalogue, p.datasets, {t: registries.task(t) for t in p.tasks})
    assert len(gaps) == 10 * 3 - 18 and not gaps["reason"].str.startswith("no task entry").any()
    # the config's copy of the reasons is the registry's (config/datasets.yaml `not_supported`)
    for row in gaps.itertuples():
        assert " ".join(row.reason.split()) == " ".join(registries.datasets[row.dataset]["not_supported"][row.task].split())


def test_docs_coverage_table_lists_every_reference_task_and_dataset(registries):
    readme = (REPO / "docs" / "datasets.md").read_text()
    table = readme[readme.index("| dataset | papers | OcularBench tasks |"):]
    table = table.split("\n\n")[0]
    for name, task in registries.tasks.items():
        if task.get("papers"):
            assert f"`{name}`" in table, name
    for name, entry in registries.datasets.items():
        if entry.get("papers"):
            assert f"| `{name}` |" in table, name


def test_ocularbench_plus_extends_the_paper_grid_and_changes_nothing_else(registries):
    """config/ocularbench_plus.yaml, merged over config/ocularbench.yaml, keeps the paper's encoders in order (so
    their artifacts are reused: same results folder, same settings) and adds DINOv3 (timm) and MIRAGE."""
    plus = yaml.safe_load((REPO / "config/ocularbench_plus.yaml").read_text())
    assert set(plus) == {"encoders"}
    paper = shipped_config("ocularbench")
    n = len(paper["encoders"])
    assert plus["encoders"][:n] == paper["encoders"]
    extension = plus["encoders"][n:]
    assert extension == ["dinov3_vits16_timm", "dinov3_vitb16_timm", "dinov3_vitl16_timm", "dinov3_vithplus16_timm",
                         "mirage_base", "mirage_large"]
    for name in extension:
        entry = registries.encoders[name]
        assert entry["source"] == "timm" and "ocularbench" not in (entry.get("studies") or []), name
    merged = dict(paper, encoders=plus["encoders"])
    assert plan(merged).encoders == plus["encoders"]


def test_focus_grid_is_its_532_base_configurations(registries):
    """FOCUS's 532 base configurations = 28 models x 19 tasks: 10 vision models x 19 (190), 6 CLIP-like VLMs x 19 x
    {logistic probe, zero-shot} (228), 6 MLLMs x 19 (114). Here 18 tasks run (504 configurations); the 19th, mBRSET
    GON, has no label in mBRSET's release and is recorded in the harmonised-coverage table with the reason."""
    from retinabench.plan import WorkflowPlan
    config = shipped_config("focus")
    p = WorkflowPlan(config)
    zeroshot = {e: j.tasks for (kind, e, _), j in p.interfaces.jobs.items() if kind == "zeroshot"}
    mllm = {e: j.tasks for (kind, e, _), j in p.interfaces.jobs.items() if kind == "mllm"}
    vlms = set(zeroshot)
    assert vlms == {"clip_vitb32_openai", "siglip2_base_patch16_224", "medsiglip_448", "eyeclip", "ret_clip", "flair"}
    assert vlms <= set(p.encoders) and config["protocols"] == ["logreg"]
    n_tasks = len(p.tasks)
    vm = (len(p.encoders) - len(vlms)) * n_tasks
    vlm = len(vlms) * n_tasks + sum(len(t) for t in zeroshot.values())
    mllm_n = sum(len(t) for t in mllm.values())
    assert (n_tasks, len(mllm)) == (18, 6) and (vm, vlm, mllm_n) == (180, 216, 108)
    # the 19th task: mBRSET GON, unsupported with its reason (FOCUS's 19 of 10 datasets x 3 harmonised tasks)
    gaps = unsupported_harmonised(config["reliability"]["harmonised"], p.datasets,
                                  {t: registries.task(t) for t in p.tasks})
    mbrset_gon = gaps[(gaps["dataset"] == "mbrset_macula") & (gaps["task"] == "gon")]
    assert len(mbrset_gon) == 1 and "cup" in mbrset_gon["reason"].iloc[0].lower()
    models = len(p.encoders) + len(vlms) + len(mllm)  # VLMs count once per method (probe, zero-shot)
    assert (vm + vlm + mllm_n) + models == 532 and models == 28
