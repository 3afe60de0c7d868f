"""Derived (harmonised) task labels as registry data: mapping checks, task_rows / make_split, groups, coverage."""
import numpy as np
import pandas as pd
import pytest

from retinabench.data.derived import (DeriveError, apply_derive, derive_map, harmonised_groups, transfer_groups,
                                      unsupported_harmonised)
from retinabench.data.splits import make_split, task_rows

ANY_DR = {"name": "d_anydr", "dataset": "d", "label": "dr3", "classes": ["no", "yes"], "modality": "cfp",
          "ordinal": False, "derive": {"no": ["none"], "yes": ["npdr", "pdr"]}, "harmonised": "any_dr"}


def manifest(n_patients=120, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        grade = rng.choice(["none", "npdr", "pdr"], p=[0.5, 0.3, 0.2])
        for k in range(int(rng.integers(1, 3))):
            rows.append({"image_id": f"p{p}_{k}", "patient_id": f"p{p}", "modality": "cfp", "dr3": grade})
    rows += [{"image_id": "nolab", "patient_id": "p0", "modality": "cfp", "dr3": None},
             {"image_id": "oct", "patient_id": "p1", "modality": "oct", "dr3": "pdr"}]
    return pd.DataFrame(rows).astype({"dr3": "string"})


def test_derive_maps_values_and_keeps_missing():
    rows = pd.DataFrame({"dr3": pd.Series(["none", "npdr", None, "pdr"], dtype="string")})
    assert apply_derive(rows, ANY_DR)["dr3"].tolist() == ["no", "yes", pd.NA, "yes"]
    assert apply_derive(rows, {**ANY_DR, "derive": None}) is rows


@pytest.mark.parametrize("derive, msg", [
    ({"no": ["none"], "maybe": ["npdr"]}, "not in classes"),
    ({"no": ["none"]}, "no source values for classes"),
    ({"no": ["none", "npdr"], "yes": ["npdr", "pdr"]}, "maps to both"),
    ({"no": "none", "yes": ["pdr"]}, "non-empty list"),
])
def test_bad_derive_specs_fail_with_the_reason(derive, msg):
    with pytest.raises(DeriveError, match=msg):
        derive_map({**ANY_DR, "derive": derive})


def test_unmapped_source_value_fails():
    with pytest.raises(DeriveError, match=r"values \['severe'\] have no class"):
        apply_derive(pd.DataFrame({"dr3": ["none", "severe"]}), ANY_DR)


def test_task_rows_and_split_use_derived_labels():
    m = manifest()
    rows, unlabelled = task_rows(m, ANY_DR)
    assert unlabelled == 1 and "oct" not in set(rows["image_id"])
    assert set(rows["dr3"]) == {"no", "yes"}
    assert (rows["dr3"] == "yes").sum() == m.loc[m["modality"].eq("cfp"), "dr3"].isin(["npdr", "pdr"]).sum()
    assert set(m["dr3"].dropna()) == {"none", "npdr", "pdr"}  # the manifest itself is untouched
    split = make_split(m, ANY_DR, seed=0)
    truth = m.set_index("image_id")["dr3"].isin(["npdr", "pdr"]).astype(int)
    assert (split["y"].to_numpy() == truth.loc[split["image_id"]].to_numpy()).all()
    assert set(split["label"]) == {"no", "yes"}


def test_registry_derivations_cover_the_adapters_codes(registries):
    """Every value an adapter can write into a mapping derive's source column maps to a class of the task."""
    from retinabench.data.adapters import adapter_info
    derived = {n: t for n, t in registries.tasks.items() if t.get("derive") and derive_map(t) is not None}
    assert {"phantom_cfp_anydr", "tvhl_cfp_anydr", "tvhl_oct_anydr", "phantom_siteb_cfp_anydr"} <= set(derived)
    for name, task in derived.items():
        entry = registries.datasets[task["dataset"]]
        written = adapter_info(entry["adapter"]).label_classes(entry)[task["label"]]
        assert set(derive_map(task)) == set(written), name


REFERABLE = {"name": "d_ref", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "modality": "cfp",
             "ordinal": False, "harmonised": "referable_dr",
             "derive": {"sources": ["dr5", "dme"],
                        "rules": [{"class": "yes", "any": {"dr5": ["moderate", "severe", "pdr"], "dme": ["yes"]}},
                                  {"class": "no", "all": {"dr5": ["none", "mild"], "dme": ["no"]}}]}}


def test_rules_derive_combines_columns_and_counts_undecided(capsys):
    rows = pd.DataFrame({"image_id": list("abcdefg"),
                         "dr5": ["none", "mild", "moderate", "mild", "none", "pdr", "mild"],
                         "dme": ["no", "no", "no", "yes", None, None, None]}).astype("string")
    out = apply_derive(rows, REFERABLE)
    # a known positive arm decides even when the other arm is unknown; a negative needs both arms known
    assert out.set_index("image_id")["dr5"].to_dict() == {"a": "no", "b": "no", "c": "yes", "d": "yes", "f": "yes"}
    assert "2 of 7 labelled rows match no derive rule" in capsys.readouterr().err
    assert rows["dr5"].tolist()[2] == "moderate"  # the input is not changed


@pytest.mark.parametrize("change, msg", [
    ({"label": "dme2"}, "must include the task's label"),
    ({"derive": {"sources": ["dr5"], "rules": [{"class": "maybe", "any": {"dr5": ["pdr"]}}]}}, "must have a `class`"),
    ({"derive": {"sources": ["dr5"], "rules": [{"class": "yes", "any": {"dr5": ["pdr"]}}]}}, "produces classes"),
    ({"derive": {"sources": ["dr5"], "rules": [{"class": "yes", "any": {"dme": ["yes"]}},
                                               {"class": "no", "any": {"dr5": ["none"]}}]}}, "not in sources"),
])
def test_bad_rules_fail_with_the_reason(change, msg):
    from retinabench.data.derived import derive_rules
    with pytest.raises(DeriveError, match=msg):
        derive_rules({**REFERABLE, **change})


def test_rules_derive_rejects_unmentioned_values():
    rows = pd.DataFrame({"dr5": ["none", "ungradable"], "dme": ["no", "no"]})
    with pytest.raises(DeriveError, match=r"dr5 values \['ungradable'\] appear in no derive rule"):
        apply_derive(rows, REFERABLE)
    ok = {**REFERABLE, "derive": {**REFERABLE["derive"], "unlabelled": {"dr5": ["ungradable"]}}}
    assert len(apply_derive(rows, ok)) == 1


def test_task_rows_with_rules_derive_keeps_the_unlabelled_count():
    m = pd.DataFrame({"image_id": ["a", "b", "c", "d"], "modality": "cfp", "patient_id": ["1", "2", "3", "4"],
                      "dr5": ["moderate", None, "none", "mild"], "dme": ["no", "yes", "no", None]}
                     ).astype({"dr5": "string", "dme": "string"})
    rows, unlabelled = task_rows(m, REFERABLE)
    assert unlabelled == 1  # only the missing primary column counts (it is what the adapter records)
    assert rows.set_index("image_id")["dr5"].to_dict() == {"a": "yes", "c": "no"}


def test_harmonised_groups_and_errors(registries):
    demo = {n: t for n, t in registries.tasks.items() if t["dataset"] in ("phantom", "phantom_siteb", "tvhl")}
    groups = harmonised_groups(demo)
    assert groups["any_dr_cfp"] == ["phantom_cfp_anydr", "phantom_siteb_cfp_anydr", "tvhl_cfp_anydr"]
    assert groups["gon_cfp"] == ["phantom_cfp_glaucoma", "phantom_siteb_cfp_glaucoma"]
    assert "any_dr_oct" not in transfer_groups(demo)  # only TVHL has OCT any-DR
    # FOCUS's tasks, its label variants in place of the tasks they redefine (tests/data/test_label_variants.py)
    paper = {n: t for n, t in registries.tasks.items() if "focus" in t.get("papers", [])}
    replaced = {t.get("variant_of") for t in paper.values()}
    focus = harmonised_groups({n: t for n, t in paper.items() if n not in replaced})
    assert len(focus["any_dr_cfp"]) == 7 and len(focus["referable_dr_cfp"]) == 7 and len(focus["gon_cfp"]) == 5
    bad = {"a": {**ANY_DR, "dataset": "A"}, "b": {**ANY_DR, "dataset": "B", "classes": ["neg", "pos"]}}
    with pytest.raises(DeriveError, match="different classes"):
        harmonised_groups(bad)
    with pytest.raises(DeriveError, match="several tasks"):
        harmonised_groups({"a": ANY_DR, "b": ANY_DR})


def test_unsupported_harmonised_tasks_are_recorded_never_silent(registries):
    catalogue = {"referable_dr": {"not_supported": {"tvhl": "NPDR not split"}}, "gon": {}, "any_dr": {}}
    tasks = {n: t for n, t in registries.tasks.items() if t["dataset"] == "tvhl"}
    rows = unsupported_harmonised(catalogue, ["tvhl"], tasks).set_index("task")["reason"].to_dict()
    assert rows == {"referable_dr": "NPDR not split", "gon": "no task entry in the task registry"}
    with pytest.raises(DeriveError, match="also listed"):
        unsupported_harmonised({"any_dr": {"not_supported": {"tvhl": "x"}}}, ["tvhl"], tasks)
