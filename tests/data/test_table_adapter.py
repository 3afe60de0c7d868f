"""The generic table adapter on small hand-made layouts: index formats, header quirks, joins, unpivot, codings,
and the errors a malformed entry or raw file must raise (naming the file, row, column or key)."""
import json

import pandas as pd
import pytest

from retinabench.data.adapters.labels import InvalidLabelError
from retinabench.data.adapters.table import TableConfigError, adapt_table, cell_text, plan
from retinabench.data.raw_fixtures import write_image


def entry(**table):
    return {"name": "own", "adapter": "table", "table": {"modality": "cfp", "patient": {"column": "pid"}, **table}}


@pytest.fixture
def folder(tmp_path):
    for i, name in enumerate(["a", "b", "c", "d"]):
        write_image(tmp_path / "img" / f"{name}.jpg", i)
    return tmp_path


def test_cell_text_normalises_numbers_and_blanks():
    assert [cell_text(v) for v in (1.0, 2.5, None, float("nan"), " x\xa0", True, pd.NA)] == \
        ["1", "2.5", "", "", "x", "1", ""]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet", "json", "xlsx"])
def test_every_index_format_reads_the_same(folder, fmt):
    data = pd.DataFrame({"file": ["a", "b"], "pid": ["p1", "p1"], "grade": [0, 1], "sex": ["F", "M"]})
    path = folder / f"labels.{fmt}"
    if fmt == "csv":
        data.to_csv(path, index=False)
    elif fmt == "tsv":
        data.to_csv(path, index=False, sep="\t")
    elif fmt == "parquet":
        data.to_parquet(path)
    elif fmt == "json":
        path.write_text(json.dumps(data.to_dict("records")))
    else:
        data.to_excel(path, index=False)
    e = entry(sources=[{"file": path.name}], image={"template": "img/{file}.jpg"}, image_id="{file}",
              sex={"column": "sex", "codes": {"F": "female", "M": "male"}},
              labels={"g": {"column": "grade", "codes": {"0": "no", "1": "yes"}}})
    m, excl = adapt_table(folder, e)
    assert m.set_index("image_id")[["patient_id", "sex", "g"]].to_dict("index") == {
        "a": {"patient_id": "p1", "sex": "female", "g": "no"}, "b": {"patient_id": "p1", "sex": "male", "g": "yes"}}


def test_invalid_labels_are_one_error_listing_every_row_or_exclusions(folder):
    pd.DataFrame({"file": ["a", "b", "c"], "pid": ["1", "2", "3"], "grade": ["0", "7", "x"]}).to_csv(
        folder / "l.csv", index=False)
    e = entry(sources=[{"file": "l.csv"}], image={"template": "img/{file}.jpg"},
              labels={"g": {"column": "grade", "codes": {"0": "no", "1": "yes"}}})
    with pytest.raises(InvalidLabelError) as err:
        plan(folder, e)
    assert "l.csv:row 3: grade='7'" in str(err.value) and "l.csv:row 4: grade='x'" in str(err.value)
    m, excl = adapt_table(folder, {**e, "invalid_labels": "exclude"})
    assert m["g"].isna().sum() == 2 and (excl["scope"] == "label:g").sum() == 2


def test_unknown_metadata_codes_and_bad_ages_are_missing_and_recorded(folder):
    pd.DataFrame({"file": ["a", "b"], "pid": ["1", "2"], "sex": ["3", "F"], "age": ["n/a", "300"]}).to_csv(
        folder / "l.csv", index=False)
    p = plan(folder, entry(sources=[{"file": "l.csv"}], image={"template": "img/{file}.jpg"},
                           sex={"column": "sex", "codes": {"F": "female"}}, age={"column": "age"}))
    assert p.rows["sex"].isna().tolist() == [True, False] and p.rows["age"].isna().all()
    r = list(p.exclusions.frame()["reason"])
    assert "unknown sex code '3' in sex read as missing" in r
    assert "age 'n/a' in age is not a number: read as missing" in r and "age '300' outside [0, 120]: read as missing" in r


def test_a_column_the_table_lacks_is_named_with_the_columns_it_has(folder):
    pd.DataFrame({"file": ["a"], "pid": ["1"]}).to_csv(folder / "l.csv", index=False)
    with pytest.raises(TableConfigError, match=r"label 'g' names column 'Grade', which is not in the table; "
                                               r"columns: \['file', 'pid'\]"):
        plan(folder, entry(sources=[{"file": "l.csv"}], image={"template": "img/{file}.jpg"},
                           labels={"g": {"column": "Grade", "codes": {"0": "no"}}}))
    with pytest.raises(TableConfigError, match=r"template field \{name\} is not a column"):
        plan(folder, entry(sources=[{"file": "l.csv"}], image={"template": "img/{name}.jpg"}))
    with pytest.raises(FileNotFoundError, match="missing.csv not found"):
        plan(folder, entry(sources=[{"file": "missing.csv"}], image={"template": "img/{file}.jpg"}))


def test_per_patient_labels_join_onto_per_eye_images(folder):
    pd.DataFrame({"file": ["a", "b", "c"], "pid": ["1", "1", "2"]}).to_csv(folder / "images.csv", index=False)
    pd.DataFrame({"patient": ["1", "3"], "diabetes": ["yes", "no"]}).to_csv(folder / "patients.csv", index=False)
    e = entry(sources=[{"file": "images.csv"}], image={"template": "img/{file}.jpg"}, image_id="{file}",
              join=[{"file": "patients.csv", "keys": {"pid": "patient"}, "columns": ["diabetes"]}],
              labels={"diabetes": {"column": "diabetes", "codes": {"yes": "yes", "no": "no"}}})
    m, excl = adapt_table(folder, e)
    got = m.set_index("image_id")["diabetes"]
    assert got[["a", "b"]].tolist() == ["yes", "yes"] and pd.isna(got["c"])
    assert excl.loc[excl["scope"] == "label:diabetes", "reason"].tolist() == ["no row in patients.csv for this image"]
    pd.DataFrame({"patient": ["1", "1"], "diabetes": ["yes", "no"]}).to_csv(folder / "patients.csv", index=False)
    with pytest.raises(ValueError, match=r"1 key\(s\) occur more than once.*\{'patient': '1'\} at rows \[2, 3\]"):
        plan(folder, e)


def test_two_rows_naming_one_image_is_an_error_naming_both(folder):
    pd.DataFrame({"file": ["a", "a"], "pid": ["1", "2"]}).to_csv(folder / "l.csv", index=False)
    with pytest.raises(ValueError, match=r"image img/a.jpg is named by two rows \(l.csv:row 2 and l.csv:row 3\)"):
        plan(folder, entry(sources=[{"file": "l.csv"}], image={"template": "img/{file}.jpg"}))


def test_index_lookup_refuses_two_files_with_one_stem(folder):
    write_image(folder / "other" / "a.jpg", 9)
    pd.DataFrame({"file": ["a"], "pid": ["1"]}).to_csv(folder / "l.csv", index=False)
    from retinabench.data.adapters.common import DuplicateFileError
    with pytest.raises(DuplicateFileError, match="'a': img/a.jpg and other/a.jpg"):
        plan(folder, entry(sources=[{"file": "l.csv"}], image={"index": "*/*.jpg", "key": "{file}"}))


def test_xlsx_two_row_header_and_title_rows(tmp_path):
    import openpyxl
    wb = openpyxl.Workbook()
    ws = wb.active
    for r in (["A title"], [], ["id", "Status", None, "file"], [None, "x", "y", None], ["1", 0, 1, "a"]):
        ws.append(r)
    wb.save(tmp_path / "t.xlsx")
    write_image(tmp_path / "a.jpg", 0)
    p = plan(tmp_path, entry(sources=[{"file": "t.xlsx", "header_rows": [3, 4]}], image={"template": "{file}.jpg"},
                             patient={"column": "id"},
                             labels={"y": {"column": "Status/y", "codes": {"0": "no", "1": "yes"}}}))
    assert p.rows["y"].tolist() == ["yes"]


def test_listing_regex_must_match_every_file(tmp_path):
    write_image(tmp_path / "NORMAL" / "1.jpg", 0)
    write_image(tmp_path / "odd.jpg", 1)
    e = {"name": "own", "table": {"modality": "oct", "patient": {"per_image": True},
                                  "listing": {"glob": "**/*.jpg", "regex": r"(?P<cls>[A-Z]+)/[^/]+"}}}
    with pytest.raises(TableConfigError, match=r"(?s)1 file\(s\) under '\*\*/\*.jpg' do not match.*odd.jpg"):
        plan(tmp_path, e)
