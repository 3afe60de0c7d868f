"""The generic table adapter on small hand-made layouts: index formats, header quirks, joins, unpivot, codings,
and the errors a malformed entry or raw file must raise (naming the file, row, column or key)."""
import json

import pandas as pd
import pytest

from retinabench.data.adapters.labels import InvalidLabelError
from retinabench.data.adapters.table import TableConfigError, adapt_table, cell_text, plan
from retinabench.testing.raw_files import write_image


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


def test_the_docs_walkthrough_runs_as_written(tmp_path):
    """docs/datasets.md's `mystudy` walk-through YAML, on a folder shaped as it describes, gives the manifest it
    promises."""
    import re
    from pathlib import Path

    import openpyxl
    import yaml

    from retinabench.data.splits import task_rows
    from retinabench.registry import _schema  # the entry must also pass the registry schemas

    readme = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    start = readme.index("### A richer table: the `mystudy` walk-through")  # up to the next heading (the Python contract)
    section = readme[start:readme.index("\n## ", start)]
    dataset_yaml, tasks_yaml = re.findall(r"```yaml\n(.*?)```", section, re.S)
    entry = {"name": "mystudy", **yaml.safe_load(dataset_yaml)["mystudy"]}
    tasks = yaml.safe_load(tasks_yaml)
    import jsonschema
    jsonschema.validate({k: v for k, v in entry.items() if k != "name"}, _schema("datasets"))
    for t in tasks.values():
        jsonschema.validate(t, _schema("tasks"))

    root = tmp_path / "mystudy"
    wb = openpyxl.Workbook()
    ws = wb.active
    for r in (["Study images, exported 2024"], ["Photo", "Subject", "Eye", "Grade", "Edema", "Gradable"],
              ["P001_R", "P001", "R", 2, 0, 1], ["P001_L", "P001", "L", 1, None, 1],
              ["P002_R", "P002", "R", 9, 1, 0], ["P003_L", "P003", "L", 0, 0, 1]):
        ws.append(r)
    root.mkdir()
    wb.save(root / "images.xlsx")
    pd.DataFrame({"Subject": ["P001", "P002"], "Age": [61, 47], "Sex": ["F", "unknown"],
                  "Diabetes": ["Yes", "no"]}).to_csv(root / "patients.csv", index=False)
    for i, name in enumerate(["P001_R", "P001_L", "P002_R", "P003_L", "P004_R"]):
        write_image(root / "photos" / f"{name}.jpg", i)

    m, excl = adapt_table(root, entry)
    got = m.set_index("image_id")[["patient_id", "eye", "age", "sex", "quality", "dr5", "dme", "diabetes"]]
    assert got.astype(object).where(got.notna(), None).to_dict("index") == {
        "P001_R": {"patient_id": "P001", "eye": "OD", "age": 61.0, "sex": "female", "quality": "good",
                   "dr5": "moderate", "dme": "no", "diabetes": "yes"},
        "P001_L": {"patient_id": "P001", "eye": "OS", "age": 61.0, "sex": "female", "quality": "good",
                   "dr5": "mild", "dme": None, "diabetes": "yes"},
        "P002_R": {"patient_id": "P002", "eye": "OD", "age": 47.0, "sex": None, "quality": "poor",
                   "dr5": None, "dme": "yes", "diabetes": "no"},
        "P003_L": {"patient_id": "P003", "eye": "OS", "age": None, "sex": None, "quality": "good",
                   "dr5": "none", "dme": "no", "diabetes": None}}
    assert set(excl["reason"]) >= {"ungradable", "not graded", "image not named by any index row: no labels or metadata"}
    ref = {**tasks["mystudy_cfp_referable"], "name": "mystudy_cfp_referable"}
    rows, unlabelled = task_rows(m, ref)
    # P002 has no grade (unlabelled); P001_L is mild DR with unknown edema: neither referable nor known not
    assert unlabelled == 1 and rows.set_index("image_id")["dr5"].to_dict() == {"P001_R": "yes", "P003_L": "no"}


def table_docs() -> str:
    """docs/datasets.md, section 'The table adapter' (to the end of the file or the next '## ' heading)."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    start = text.index("\n## The table adapter\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_every_table_option_is_documented_with_a_schema_valid_example():
    """Each option of the table schema (and of its sources, join, image and patient items) is named in the docs'
    table-adapter section, and every YAML example there passes the registry schema."""
    import re

    import jsonschema
    import yaml

    from retinabench.registry import _schema
    schema = _schema("datasets")
    docs = table_docs()
    table = schema["properties"]["table"]["properties"]
    options = set(table) | set(schema["$defs"]["table_file"]["properties"])
    options |= set(schema["$defs"]["listing"]["properties"])
    for nested in ("join", "sources"):
        options |= set(table[nested]["items"]["properties"])
    options |= set(table["image"]["properties"]) | set(table["patient"]["properties"])
    options |= set(schema["$defs"]["fields"]["additionalProperties"]["properties"])
    undocumented = sorted(o for o in options if f"`{o}`" not in docs and f"`{o}:" not in docs)
    assert not undocumented, f"table options without a word in docs/datasets.md: {undocumented}"

    blocks = re.findall(r"```yaml\n(.*?)```", docs, re.S)
    examples = {option: 0 for option in table}
    validator = jsonschema.Draft202012Validator(schema)
    for block in blocks:
        doc = yaml.safe_load(block)
        if "table" in doc:
            for option in doc["table"]:
                examples[option] += 1
            entry = {"adapter": "table", "root": "x", "index_files": [], "modalities": ["cfp"],
                     "web_exposure_risk": "low",
                     "table": {"modality": "cfp", "patient": {"per_image": True}, **doc["table"]}}
        else:  # a whole registry entry
            (entry,) = doc.values()
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(entry)]
        assert not errors, f"docs example does not pass the schema:\n{block}\n{errors}"
    assert not [o for o, n in examples.items() if n == 0], f"options without an example: {examples}"


def test_paths_that_stay_inside_the_root_are_accepted_and_stored_relative(folder):
    """The root wall refuses only what lands outside: a symlink within the root and an absolute path under it pass
    (the latter stored relative to the root, so the manifest stays portable)."""
    (folder / "img" / "alias.jpg").symlink_to(folder / "img" / "a.jpg")
    pd.DataFrame({"file": ["img/alias.jpg", str(folder / "img" / "b.jpg")], "pid": ["1", "2"]}).to_csv(
        folder / "l.csv", index=False)
    m, _ = adapt_table(folder, entry(sources=[{"file": "l.csv"}], image={"column": "file"}))
    assert sorted(m["path"]) == ["img/alias.jpg", "img/b.jpg"]
