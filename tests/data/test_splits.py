import numpy as np
import pandas as pd
import pytest

from retinabench.data.splits import SplitError, check_split, make_split

TASK = {"name": "t", "dataset": "d", "label": "lab", "classes": ["a", "b", "c"], "modality": "cfp", "ordinal": True}


def synthetic_manifest(n_patients=200, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        for eye in ("OD", "OS")[: rng.integers(1, 3)]:
            lab = rng.choice(["a", "b", "c"], p=[0.6, 0.3, 0.1])
            for k in range(rng.integers(1, 3)):
                rows.append({"image_id": f"p{p}_{eye}_{k}", "patient_id": f"p{p}", "modality": "cfp", "lab": lab})
    rows.append({"image_id": "oct_x", "patient_id": "p0", "modality": "oct", "lab": "a"})
    rows.append({"image_id": "nolabel", "patient_id": "p1", "modality": "cfp", "lab": None})
    return pd.DataFrame(rows)


def test_split_is_patient_disjoint_stratified_and_deterministic():
    m = synthetic_manifest()
    s1 = make_split(m, TASK, seed=3)
    s2 = make_split(m.sample(frac=1, random_state=1), TASK, seed=3)  # row order must not matter
    pd.testing.assert_frame_equal(s1, s2)
    assert "oct_x" not in set(s1["image_id"]) and "nolabel" not in set(s1["image_id"])
    assert s1.groupby("patient_id")["split"].nunique().max() == 1
    frac = s1["split"].value_counts(normalize=True)
    assert abs(frac["train"] - 0.70) < 0.05 and abs(frac["test"] - 0.15) < 0.05
    prev = s1.groupby("split")["y"].apply(lambda y: (y == 2).mean())
    assert prev.max() - prev.min() < 0.06  # stratified: the rare class has similar prevalence everywhere
    assert not make_split(m, TASK, seed=4)["split"].equals(s1["split"])


def test_balanced_variant_has_equal_class_counts_and_is_a_subset():
    s = make_split(synthetic_manifest(), TASK, seed=0)
    for part in ("train", "val", "test"):
        bal = s[(s["split"] == part) & s["balanced"]]
        counts = bal["y"].value_counts()
        assert counts.nunique() == 1 and len(counts) == 3
        assert counts.iloc[0] == s[s["split"] == part]["y"].value_counts().min()


def test_patient_in_two_splits_fails_loudly():
    s = make_split(synthetic_manifest(), TASK, seed=0)
    sizes = s[s["split"] == "train"].groupby("patient_id").size()
    victim = sizes[sizes >= 2].index[0]
    s.loc[s.index[s["patient_id"] == victim][0], "split"] = "test"
    with pytest.raises(SplitError, match=f"patient {victim} appears in"):
        check_split(s, TASK)


def test_class_missing_from_a_split_names_class_and_counts():
    m = synthetic_manifest()
    rare = m[m["lab"] == "c"]["patient_id"].unique()[:1]
    m = m[(m["lab"] != "c") | m["patient_id"].isin(rare)]
    with pytest.raises(SplitError, match=r"class 'c' has no images in (val|test|train) \(train \d+, val \d+, test \d+\)"):
        make_split(m, TASK, seed=0)


def test_unknown_label_and_bad_fractions_are_errors():
    m = synthetic_manifest()
    m.loc[0, "lab"] = "zzz"
    with pytest.raises(SplitError, match=f"image {m.loc[0, 'image_id']} has label 'zzz'"):
        make_split(m, TASK)
    with pytest.raises(SplitError, match="sum to 1"):
        make_split(synthetic_manifest(), TASK, fractions={"train": 0.5, "val": 0.2, "test": 0.2})


def test_tvhl_splits_are_patient_disjoint(tvhl_manifest, registries):
    manifest, _ = tvhl_manifest
    for name in ("tvhl_cfp_dr3", "tvhl_cfp_dme", "tvhl_oct_dr3", "tvhl_oct_dme"):
        task = registries.task(name)
        s = make_split(manifest, task, seed=0)
        assert s.groupby("patient_id")["split"].nunique().max() == 1
        assert set(s["label"]) == set(task["classes"])
        n_expected = manifest[(manifest["modality"] == task["modality"]) & manifest[task["label"]].notna()].shape[0]
        assert len(s) == n_expected
