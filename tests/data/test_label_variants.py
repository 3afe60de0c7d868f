"""Paper label variants (FOCUS's) as declared task entries: PAPILA suspects positive, RFMiD's referable DR from an
edema flag (flagged as an approximation), mBRSET GON from an optional cup-to-disc column; selected by name only."""
import pandas as pd
import pytest

from retinabench.data.adapters.table import adapt_table
from retinabench.data.derived import DeriveError, harmonised_groups, label_variants
from retinabench.data.splits import task_rows
from retinabench.testing.raw_files import write_image


def papila_manifest():
    codes = {"0": "healthy", "1": "glaucoma", "2": "suspect"}  # the data descriptor's Diagnosis coding
    diagnosis = ["0", "1", "2", "0", "2", "1", "0"]
    return pd.DataFrame({"image_id": [f"RET{i:03d}OD" for i in range(len(diagnosis))],
                         "patient_id": [str(i) for i in range(len(diagnosis))], "modality": "cfp",
                         "glaucoma3": pd.Series([codes[d] for d in diagnosis], dtype="string")})


def test_papila_suspects_leave_our_task_and_are_positive_in_focus_s(registries):
    m = papila_manifest()
    ours, _ = task_rows(m, registries.task("papila_cfp_gon"))
    focus, _ = task_rows(m, registries.task("papila_cfp_gon_focus"))
    assert len(ours) == 5 and ours["glaucoma3"].tolist() == ["no", "yes", "no", "yes", "no"]  # 2 suspects gone
    assert len(focus) == 7 and (focus["glaucoma3"] == "yes").sum() == 4  # FOCUS: Diagnosis > 0
    v = registries.task("papila_cfp_gon_focus")
    assert v["label_variant"] == "focus" and v["variant_of"] == "papila_cfp_gon" and "suspect" in v["approximation"]


def table_entry(labels):
    return {"name": "own", "adapter": "table", "table": {"modality": "cfp", "patient": {"column": "pid"},
                                                        "sources": [{"file": "l.csv"}],
                                                        "image": {"template": "img/{file}.jpg"}, "image_id": "{file}",
                                                        "labels": labels}}


@pytest.fixture
def folder(tmp_path):
    for i, name in enumerate(["a", "b", "c"]):
        write_image(tmp_path / "img" / f"{name}.jpg", i)
    return tmp_path


def test_rfmid_referable_focus_reads_the_edema_flag_and_is_flagged(folder, registries):
    entry = registries.datasets["rfmid_riadd"]
    cme = entry["table"]["labels"]["cme"]
    assert cme["column"] == "CME"
    pd.DataFrame({"file": ["a", "b", "c"], "pid": ["1", "2", "3"], "DR": ["1", "1", "0"],
                  "CME": ["0", "1", "0"]}).to_csv(folder / "l.csv", index=False)
    m, _ = adapt_table(folder, table_entry({"cme": cme, "dr": entry["table"]["labels"]["dr"]}))
    task = registries.task("rfmid_riadd_cfp_referable_focus")
    rows, _ = task_rows(m, task)
    # image a: DR without edema is non-referable under FOCUS's label: the approximation the entry declares
    assert rows.set_index("image_id")["cme"].to_dict() == {"a": "no", "b": "yes", "c": "no"}
    assert task["harmonised"] == "referable_dr" and "CME flag alone" in task["approximation"]
    assert "variant_of" not in task  # we have no referable-DR task on RFMiD


def test_optional_label_column_absent_is_unlabelled_with_the_reason(folder, registries):
    cdr = registries.datasets["mbrset"]["table"]["labels"]["increased_cdr"]
    assert cdr["optional"] is True
    pd.DataFrame({"file": ["a", "b", "c"], "pid": ["1", "2", "3"]}).to_csv(folder / "l.csv", index=False)
    m, excl = adapt_table(folder, table_entry({"increased_cdr": cdr}))
    assert m["increased_cdr"].isna().all()
    rec = excl[excl["scope"] == "label:increased_cdr"]
    assert len(rec) == 3 and set(rec["reason"]) == {"no 'increased_cdr' column in this label table (optional label)"}
    pd.DataFrame({"file": ["a", "b", "c"], "pid": ["1", "2", "3"], "increased_cdr": ["yes", "No", ""]}).to_csv(
        folder / "l.csv", index=False)
    m, excl = adapt_table(folder, table_entry({"increased_cdr": cdr}))
    rows, unlabelled = task_rows(m, registries.task("mbrset_macula_cfp_gon_focus"))
    assert rows.set_index("image_id")["increased_cdr"].to_dict() == {"a": "yes", "b": "no"} and unlabelled == 1


def test_a_variant_and_its_task_in_one_grid_is_an_error(registries):
    tasks = {n: registries.task(n) for n in ("papila_cfp_gon", "papila_cfp_gon_focus")}
    with pytest.raises(DeriveError, match=r"dataset\(s\) \['papila'\] have several tasks"):
        harmonised_groups(tasks)
    table = label_variants(tasks)
    assert table["task"].tolist() == ["papila_cfp_gon_focus"]


def test_variant_declarations_are_checked(registries):
    v = registries.task("papila_cfp_gon_focus")
    base = registries.task("papila_cfp_gon")
    with pytest.raises(DeriveError, match="label_variant 'ocularbench' unknown"):
        label_variants({"x": {**v, "label_variant": "ocularbench"}})
    with pytest.raises(DeriveError, match="differs in"):
        label_variants({"papila_cfp_gon": base, "x": {**v, "harmonised": "any_dr"}})
    with pytest.raises(DeriveError, match="`approximation` belongs to a label variant"):
        label_variants({"x": {**base, "approximation": "..."}})


def test_variants_are_selected_by_name_only(registries):
    from retinabench.plan.selection import plan
    from tests.conftest import shipped_config
    config = {**shipped_config("focus"), "datasets": ["papila", "rfmid_riadd"], "tasks": None}
    p = plan(config)
    assert "papila_cfp_gon" in p.tasks and not [t for t in p.tasks if t.endswith("_focus")]
    focus = plan(shipped_config("focus"))
    assert {"papila_cfp_gon_focus", "rfmid_riadd_cfp_referable_focus", "rfmid2_cfp_referable_focus"} <= set(focus.tasks)


def test_coverage_table_records_each_variant_s_approximation(registries):
    from retinabench.reliability import harmonised_coverage
    from retinabench.settings import ReliabilitySettings
    tasks = {n: registries.task(n) for n in ("papila_cfp_gon_focus", "rfmid_riadd_cfp_referable_focus")}
    cov = harmonised_coverage(ReliabilitySettings(), ["papila", "rfmid_riadd"], tasks)
    v = cov[cov["scope"] == "label_variant"].set_index("task")
    assert v.loc["rfmid_riadd_cfp_referable_focus", "reason"].startswith("label variant focus: approximation: "
                                                                        "referable DR from the CME flag alone")
    assert v.loc["papila_cfp_gon_focus", "reason"].endswith("ours: papila_cfp_gon")
