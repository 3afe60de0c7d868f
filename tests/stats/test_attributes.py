"""Table 1 (sensitive-attribute distribution per dataset) on a small hand-made manifest."""
import math

import pandas as pd
import pytest

from retinabench.stats.attributes import attribute_distribution, attribute_latex

# OcularBench's binarisation, as the fairness analysis groups (reliability.attributes age / sex)
ATTRIBUTES = [{"name": "age", "column": "age", "cut": 60, "groups": None},
              {"name": "sex", "column": "sex", "cut": None, "groups": ["female", "male"]}]


def manifest():
    # dsA: ages 30, 59.9, 60, 75, unknown; sexes F, F, M, unknown, "other" (outside the groups)
    # dsB: no age at all; sexes M, M
    return pd.DataFrame({
        "image_id": [f"i{i}" for i in range(7)],
        "dataset": ["dsA"] * 5 + ["dsB"] * 2,
        "age": [30.0, 59.9, 60.0, 75.0, None, None, None],
        "sex": ["female", "female", "male", None, "other", "male", "male"],
    })


def test_counts_and_percentages_per_dataset():
    t = attribute_distribution(manifest(), ATTRIBUTES).set_index(["dataset", "attribute", "group"])
    # age: < 60 is 30 and 59.9; 60 itself is >= 60 (the cut is "below vs at or above")
    assert t.loc[("dsA", "age", "<60"), "n"] == 2 and t.loc[("dsA", "age", ">=60"), "n"] == 2
    assert t.loc[("dsA", "age", "<60"), "percent"] == pytest.approx(50.0)
    assert t.loc[("dsA", "age", "<60"), "n_known"] == 4 and t.loc[("dsA", "age", "<60"), "n_unknown"] == 1
    assert t.loc[("dsA", "age", "<60"), "cut"] == 60
    # sex: the unknown and the value outside female / male are both left out of the percentages
    assert t.loc[("dsA", "sex", "female"), "n"] == 2 and t.loc[("dsA", "sex", "male"), "n"] == 1
    assert t.loc[("dsA", "sex", "female"), "percent"] == pytest.approx(200 / 3)
    assert t.loc[("dsA", "sex", "male"), "n_unknown"] == 2 and t.loc[("dsA", "sex", "male"), "n_images"] == 5
    # a dataset without ages: one "unknown" row; its sexes are all male
    assert t.loc[("dsB", "age", "unknown"), "n"] == 2 and math.isnan(t.loc[("dsB", "age", "unknown"), "percent"])
    assert t.loc[("dsB", "sex", "female"), "n"] == 0 and t.loc[("dsB", "sex", "male"), "percent"] == 100.0
    # percentages of an attribute's groups add to 100 where known
    known = t.reset_index()
    known = known[known["group"] != "unknown"]
    assert known.groupby(["dataset", "attribute"])["percent"].sum().tolist() == pytest.approx([100.0] * 3)


def test_latex_table_has_one_row_per_dataset():
    tex = attribute_latex(attribute_distribution(manifest(), ATTRIBUTES))
    assert r"dsA & 5 & 2 (50.0\%) & 2 (50.0\%) & 2 (66.7\%) & 1 (33.3\%) & 1 & 2 \\" in tex
    assert r"dsB & 2 & -- & -- & 0 (0.0\%) & 2 (100.0\%) & 2 & 0 \\" in tex
    assert r"age: <60 & age: >=60 & sex: female & sex: male & age unknown & sex unknown" in tex


def test_bad_input_is_named():
    with pytest.raises(KeyError, match=r"lack column\(s\) \['sex'\]"):
        attribute_distribution(manifest().drop(columns="sex"), ATTRIBUTES)
    with pytest.raises(ValueError, match="no attributes"):
        attribute_distribution(manifest(), [])
