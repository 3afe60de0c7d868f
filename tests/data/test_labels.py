"""Label codings: declared missing codes are unknown, anything else is invalid (an error, or an exclusion)."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from retinabench.data.adapters.common import DuplicateFileError, Exclusions, index_files
from retinabench.data.adapters.labels import InvalidLabelError, LabelCoding, LabelReader

DR = LabelCoding("dr3", "DR", {"0": "none", "NPDR": "npdr"}, missing={"-": "DR '-' (unknown)"})


def test_codes_missing_and_invalid_values():
    excl = Exclusions("d")
    reader = LabelReader(excl)
    assert reader.read(DR, " NPDR ", source="f.csv:row 2", image_id="a") == "npdr"
    assert reader.read(DR, "-", source="f.csv:row 3", image_id="b") is None
    assert reader.read(DR, "X", source="f.csv:row 4", image_id="c") is None
    assert reader.read(DR, float("nan"), source="f.csv:row 5", image_id="d") is None  # blank: not declared
    rows = excl.frame()
    assert rows[["image_id", "scope", "reason"]].values.tolist() == [["b", "label:dr3", "DR '-' (unknown)"]]
    with pytest.raises(InvalidLabelError) as err:
        reader.finish()
    msg = str(err.value)
    assert "2 label value(s)" in msg and "f.csv:row 4: DR='X'" in msg and "f.csv:row 5: DR=''" in msg


def test_exclude_policy_records_invalid_values():
    excl = Exclusions("d")
    reader = LabelReader.for_entry(excl, {"invalid_labels": "exclude"})
    reader.read(DR, "7", source="f.csv:row 9", image_id="z")
    reader.finish()  # no error
    (row,) = excl.frame().to_dict("records")
    assert row["scope"] == "label:dr3" and row["reason"].startswith("invalid value '7' in DR")


def test_unknown_policy_and_overlapping_coding_are_errors():
    with pytest.raises(ValueError, match="invalid_labels"):
        LabelReader(Exclusions("d"), "ignore")
    with pytest.raises(ValueError, match="both classes and missing"):
        LabelCoding("x", "X", {"0": "no"}, missing={"0": "zero means unknown"})


def test_same_file_name_in_two_folders_is_an_error(tmp_path):
    for sub in ("A", "B"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "img_1.jpg").write_bytes(b"x")
    (tmp_path / "A" / "img_2.jpg").write_bytes(b"y")
    with pytest.raises(DuplicateFileError, match=r"'img_1': A/img_1.jpg and B/img_1.jpg"):
        index_files(tmp_path, "*/*.jpg")
    assert index_files(tmp_path, "A/*.jpg") == {"img_1": Path("A/img_1.jpg"),
                                               "img_2": Path("A/img_2.jpg")}


def _tvhl_copy(tmp_path, tvhl_root, n=6):
    """A small copy of the raw TVHL layout: the first n fundus rows with their images, no OCT rows."""
    root = tmp_path / "tvhl"
    (root / "EYE FUNDUS/EYE FUNDUS1").mkdir(parents=True)
    (root / "OCT/OCT1").mkdir(parents=True)
    fundus = pd.read_csv(tvhl_root / "EYE FUNDUS.csv", dtype=str, keep_default_na=False).head(n)
    pd.read_csv(tvhl_root / "OCT.csv", dtype=str, keep_default_na=False).head(0).to_csv(root / "OCT.csv", index=False)
    src = {p.stem: p for p in (tvhl_root / "EYE FUNDUS").glob("*/*.jpg")}
    for name in fundus["Name"]:
        shutil.copy(src[name], root / "EYE FUNDUS/EYE FUNDUS1" / f"{name}.jpg")
    return root, fundus


@pytest.mark.shared
def test_tvhl_invalid_grades_are_errors_listing_every_row(tmp_path, tvhl_root):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    root, fundus = _tvhl_copy(tmp_path, tvhl_root)
    fundus.loc[1, "DR"], fundus.loc[3, "DR"], fundus.loc[4, "DME"] = "X", "7", "2"
    fundus.to_csv(root / "EYE FUNDUS.csv", index=False)
    with pytest.raises(InvalidLabelError) as err:
        adapt_tvhl(root, {"name": "tvhl"})
    msg = str(err.value)
    assert "3 label value(s)" in msg
    for line in ("EYE FUNDUS.csv:row 3: DR='X'", "EYE FUNDUS.csv:row 5: DR='7'", "EYE FUNDUS.csv:row 6: DME='2'"):
        assert line in msg
    manifest, excl = adapt_tvhl(root, {"name": "tvhl", "invalid_labels": "exclude"})
    assert len(manifest) == len(fundus)  # images stay (for their other label)
    invalid = excl[excl["reason"].str.startswith("invalid value")]
    assert sorted(invalid["scope"]) == ["label:dme", "label:dr3", "label:dr3"]


@pytest.mark.shared
def test_tvhl_same_image_name_in_two_subfolders_is_an_error(tmp_path, tvhl_root):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    root, fundus = _tvhl_copy(tmp_path, tvhl_root, n=2)
    fundus.to_csv(root / "EYE FUNDUS.csv", index=False)
    (root / "EYE FUNDUS/EYE FUNDUS2").mkdir()
    name = fundus["Name"][0]
    shutil.copy(root / "EYE FUNDUS/EYE FUNDUS1" / f"{name}.jpg", root / "EYE FUNDUS/EYE FUNDUS2" / f"{name}.jpg")
    with pytest.raises(DuplicateFileError, match=f"EYE FUNDUS1/{name}.jpg and EYE FUNDUS/EYE FUNDUS2/{name}.jpg"):
        adapt_tvhl(root, {"name": "tvhl"})
