"""The prompt registry: schema, snapshot of every rendered prompt, lookup by task / harmonised id, protocol names,
the leakage guard (FOCUS's BRSET glaucoma description as the leaking example) and the sensitivity table."""
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from retinabench.analysis.prompts import prompt_sensitivity, render_snapshot
from retinabench.prompts import (PromptError, PromptLeakError, forbidden_fields, load_prompts,
                                 protocol_name, render_questions, split_protocol)
from retinabench.registry import load_registry

from tests.conftest import REPO

SNAPSHOT = Path(__file__).parent / "snapshots" / "rendered_prompts.txt"
HARMONISED = [{"name": h, "harmonised": h, "dataset": "x", "classes": ["no", "yes"], "label": "dr5",
               "prompt_metadata": ["age", "sex"]} for h in ("any_dr", "referable_dr", "gon")]


@pytest.fixture(scope="module")
def registry():
    return load_prompts(REPO / "config/prompts.yaml")


@pytest.fixture(scope="module")
def tasks():
    return load_registry(REPO / "config/tasks.yaml", "tasks")


def test_rendered_prompts_match_the_snapshot(registry):
    """Every prompt the registry ships, rendered; RETINABENCH_UPDATE_SNAPSHOTS=1 rewrites the file (review the
    diff: a changed prompt changes every zero-shot / MLLM number)."""
    text = render_snapshot(registry, HARMONISED)
    if os.environ.get("RETINABENCH_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
    assert SNAPSHOT.read_text() == text


def test_focus_prompts_are_one_set_with_at_least_one_paraphrase_set_more(registry):
    for interface in ("zeroshot", "mllm"):
        assert registry.default(interface) == "focus"
        for t in HARMONISED:
            sets = registry.sets_for(interface, t)
            assert sets[0] == "focus" and len(sets) >= 3, (interface, t["name"], sets)
    zp = registry.zeroshot("focus", HARMONISED[2])
    assert zp.as_dict() == {"no": ["A fundus photograph of a healthy eye without glaucoma."],
                            "yes": ["A fundus photograph showing signs of glaucoma."]}
    ens = registry.zeroshot("ensemble", HARMONISED[0])
    assert [len(t) for t in ens.texts] == [8, 8]  # 4 templates x 2 class names per class


def test_every_focus_task_of_the_registry_gets_prompts(registry, tasks):
    focus = [t for t in tasks.values() if "focus" in (t.get("papers") or []) and t.get("harmonised")]
    assert len(focus) >= 15
    for t in focus:
        for interface in ("zeroshot", "mllm"):
            sets = registry.sets_for(interface, t)
            assert sets, (interface, t["name"])
            for s in sets:
                if interface == "zeroshot":
                    assert registry.zeroshot(s, t).classes == tuple(t["classes"])
                else:
                    p = registry.mllm(s, t)
                    assert t["classes"][p.yes_index] == "yes"
            if interface == "mllm":  # the metadata set only where the task declares its fields safe
                assert ("focus_metadata" in sets) == bool(t.get("prompt_metadata")), t["name"]
                assert ("focus_metadata" in registry.skipped_sets("mllm", t)) != bool(t.get("prompt_metadata"))


def test_metadata_prompt_needs_the_fields_declared_safe(registry, tasks):
    t = tasks["papila_cfp_gon"]  # declares no prompt metadata
    assert "sex" in registry.skipped_sets("mllm", t)["focus_metadata"]
    with pytest.raises(PromptLeakError, match=r"reads \['sex'\], which the task does not declare safe"):
        registry.mllm("focus_metadata", t)
    p = registry.mllm("focus_metadata", tasks["brset_diabetic_cfp_gon"])  # declares [age, sex]
    rows = pd.DataFrame([{"image_id": "a", "sex": "male", "age": 70.4, "increased_cup_disc": "yes"}])
    assert render_questions(p, rows)[0].startswith("A male patient aged 70 years.")


FOCUS_BRSET_LEAK = {
    "defaults": {"mllm": "focus_brset"},
    "mllm": {"focus_brset": {
        "description": "FOCUS's BRSET description, with its findings list (as FOCUS renders it)",
        "metadata": {
            "sex": {"values": {"female": "female", "male": "male"}, "missing": "sex not reported"},
            "conditions": {"fields": ["macular_edema", "scar", "nevus", "amd", "hemorrhage", "increased_cup_disc",
                                      "other"], "item": "{name}: {value}",
                           "values": {"yes": "present", "no": "absent"}, "missing": "absent"}},
        "tasks": {"gon": {"yes_class": "yes", "question": "A {sex} patient. Conditions include: {conditions}.\n\n"
                                                          "Does the patient have glaucoma? Answer yes or no."}}}}}


def test_focus_brset_glaucoma_description_is_refused_as_a_leak(tmp_path, tasks):
    """'increased cup disc: present' is BRSET's glaucoma label itself (brset_diabetic_cfp_gon's label)."""
    path = tmp_path / "leak.yaml"
    path.write_text(yaml.safe_dump(FOCUS_BRSET_LEAK))
    reg = load_prompts(path)
    task = dict(tasks["brset_diabetic_cfp_gon"])
    assert "increased_cup_disc" in forbidden_fields(task)
    with pytest.raises(PromptLeakError, match=r"shows \['increased_cup_disc'\]: .*the task's label"):
        reg.mllm("focus_brset", task)
    # declaring the label field 'safe' does not help: the label is never allowed
    task["prompt_metadata"] = ["sex", "macular_edema", "scar", "nevus", "amd", "hemorrhage", "increased_cup_disc",
                               "other"]
    with pytest.raises(PromptLeakError, match="increased_cup_disc"):
        reg.mllm("focus_brset", task)
    # the same findings list for the referable-DR task: macular edema is what the label is derived from
    ref = dict(tasks["brset_diabetic_cfp_referable"], prompt_metadata=task["prompt_metadata"])
    leak = yaml.safe_load(yaml.safe_dump(FOCUS_BRSET_LEAK))
    leak["mllm"]["focus_brset"]["tasks"] = {"referable_dr": leak["mllm"]["focus_brset"]["tasks"].pop("gon")}
    leak["mllm"]["focus_brset"]["metadata"]["conditions"]["fields"].append("dme")
    path.write_text(yaml.safe_dump(leak))
    with pytest.raises(PromptLeakError, match=r"\['macular_edema', 'dme'\]"):
        load_prompts(path).mllm("focus_brset", ref)


def test_rendered_metadata_carrying_the_label_value_or_field_name_is_refused(tmp_path):
    """A 'safe' free-text field that repeats the label: refused per row, naming the image."""
    task = {"name": "papila_like", "dataset": "p", "harmonised": "gon", "label": "glaucoma3", "classes": ["no", "yes"],
            "derive": {"sources": ["glaucoma3"], "rules": [{"class": "yes", "any": {"glaucoma3": ["glaucoma"]}}]},
            "prompt_metadata": ["sex", "history"]}
    data = {"defaults": {"mllm": "m"}, "mllm": {"m": {
        "description": "x", "metadata": {"history": {"missing": "no history"}, "sex": {"missing": "unknown"}},
        "tasks": {"gon": {"yes_class": "yes", "question": "Sex {sex}. History: {history}. Glaucoma?"}}}}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    p = load_prompts(path).mllm("m", task)
    ok = p.render({"image_id": "a", "sex": "female", "history": "cataract surgery", "glaucoma3": "healthy"})
    assert ok == "Sex female. History: cataract surgery. Glaucoma?"
    with pytest.raises(PromptLeakError, match=r"image 'b'.*\['glaucoma'\]"):
        p.render({"image_id": "b", "sex": "male", "history": "treated for glaucoma", "glaucoma3": "glaucoma"})
    with pytest.raises(PromptLeakError, match=r"glaucoma3"):  # the label field's name itself
        p.render({"image_id": "c", "sex": "male", "history": "glaucoma3 flag set", "glaucoma3": "healthy"})
    with pytest.raises(PromptError, match="no field"):
        p.render({"image_id": "d", "sex": "male", "glaucoma3": "healthy"})


def test_malformed_registries_are_refused(tmp_path):
    bad = {"defaults": {"mllm": "m"}, "mllm": {"m": {"description": "x", "tasks": {
        "gon": {"yes_class": "yes", "question": "Age {age}?"}}}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(PromptError, match=r"placeholders \['age'\] have no metadata spec"):
        load_prompts(path)
    bad["mllm"]["m"]["tasks"]["gon"]["question"] = "Age {age:.0f}?"
    bad["mllm"]["m"]["metadata"] = {"age": {}}
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(PromptError, match="must be a plain name"):
        load_prompts(path)
    path.write_text(yaml.safe_dump({"defaults": {"zeroshot": "z"}, "zeroshot": {"z": {
        "description": "x", "tasks": {"gon": {"texts": {"no": []}}}}}}))
    with pytest.raises(PromptError, match="key zeroshot/z/tasks/gon"):
        load_prompts(path)


def test_class_mismatch_and_non_binary_tasks_are_errors(registry):
    with pytest.raises(PromptError, match=r"prompts for classes \['no', 'yes'\], the task has \['a', 'b'\]"):
        registry.zeroshot("focus", {"name": "t", "harmonised": "gon", "classes": ["a", "b"], "label": "l"})
    with pytest.raises(PromptError, match="needs a binary task"):
        registry.mllm("focus", {"name": "t", "harmonised": "gon", "classes": ["a", "b", "c"], "label": "l"})
    with pytest.raises(PromptError, match="has no prompts for task"):
        registry.mllm("focus", {"name": "t", "harmonised": "amd", "classes": ["no", "yes"], "label": "l"})


def test_protocol_names_and_prompt_sensitivity():
    assert protocol_name("mllm", "focus", "focus") == "mllm"
    assert protocol_name("mllm_renorm", "plain", "focus") == "mllm_renorm@plain"
    assert split_protocol("zeroshot_focus@ensemble") == ("zeroshot_focus", "ensemble")
    assert split_protocol("logreg") == ("logreg", None)
    rows = []
    for proto, auroc in (("mllm", 0.70), ("mllm@plain", 0.60), ("mllm@clinical", 0.75), ("logreg", 0.9)):
        for seed in (0, 1):
            rows.append({"dataset": "d", "task": "t", "encoder": "m", "protocol": proto, "seed": seed,
                         "regime": "u-u", "split": "test", "metric": "auroc", "value": auroc, "n": 10})
    table = prompt_sensitivity(pd.DataFrame(rows))
    assert len(table) == 1
    r = table.iloc[0]
    assert r["base_protocol"] == "mllm" and r["n_prompt_sets"] == 3
    assert r["range"] == pytest.approx(0.15) and r["argmin"] == "plain" and r["argmax"] == "clinical"
    assert r["sd"] == pytest.approx(pd.Series([0.70, 0.60, 0.75]).std())
