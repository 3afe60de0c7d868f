"""Issue 23, "Nothing changes a result silently": each fault reproduced on a small generated fixture, with the
behaviour that replaces it (a clear error naming file, row and fix, or a recorded and printed count)."""
from pathlib import Path

import pandas as pd
import pytest

from retinabench.data.adapters.image_ids import DuplicateImageIdError
from retinabench.data.adapters.index_text import IndexFileError
from retinabench.data.adapters.root_wall import OutsideRootError
from retinabench.data.adapters.table import adapt_table, plan
from retinabench.data.adapters.tvhl import adapt_tvhl
from retinabench.data.check import check_dataset, format_checks
from retinabench.data.raw_fixtures import write_image
from retinabench.data.splits import SplitError, assign_splits, task_split
from retinabench.pipeline import run_stage
from retinabench.schemas import read_table


def table_entry(name: str = "own", **table) -> dict:
    return {"name": name, "adapter": "table", "root": name, "index_files": [], "modalities": ["cfp"],
            "web_exposure_risk": "low",
            "table": {"modality": "cfp", "patient": {"per_image": True}, **table}}


def table_job(make_manifest_job, root: Path, results: Path, entry: dict):
    return make_manifest_job(root, results, entry, dataset=entry["name"])


# --- fault 2: paths escape the dataset root ---
@pytest.fixture
def escaping_layout(tmp_path):
    """own/ holds two images; its index also names one beside the root (../), one by absolute path, one through a
    symlinked file and one through a symlinked folder that point outside."""
    data_root = tmp_path / "data"
    root = data_root / "own"
    write_image(root / "img" / "a.jpg", 0)
    write_image(root / "img" / "b.jpg", 1)
    for i, name in enumerate(("x.jpg", "y.jpg", "z.jpg")):
        write_image(data_root / "elsewhere" / name, 10 + i)
    (root / "img" / "link.jpg").symlink_to(data_root / "elsewhere" / "z.jpg")
    (root / "linked").symlink_to(data_root / "elsewhere", target_is_directory=True)
    rows = [("img/a.jpg", "0"), ("img/b.jpg", "1"), ("../elsewhere/x.jpg", "0"),
            (str(data_root / "elsewhere" / "y.jpg"), "1"), ("img/link.jpg", "0"), ("linked/x.jpg", "1")]
    pd.DataFrame(rows, columns=["file", "grade"]).to_csv(root / "labels.csv", index=False)
    entry = table_entry(sources=[{"file": "labels.csv"}], image={"column": "file"},
                        labels={"g": {"column": "grade", "codes": {"0": "no", "1": "yes"}}})
    return data_root, root, {**entry, "index_files": ["labels.csv"]}


def test_fault2_paths_outside_the_root_are_reported_by_check_and_fail_the_manifest_job(
        escaping_layout, tmp_path, make_manifest_job):
    data_root, root, entry = escaping_layout
    res = check_dataset("own", entry, data_root)
    text = "\n".join(res.details)
    assert res.status == "unreadable" and res.problem
    assert "OutsideRootError" in text and "4 path(s) resolve outside the dataset root" in text
    for row, value in ((4, "../elsewhere/x.jpg"), (5, "elsewhere/y.jpg"), (6, "img/link.jpg"), (7, "linked/x.jpg")):
        assert f"labels.csv:row {row}: " in text and value in text
    assert "named by labels.csv" in text and "Fix: move or copy those files under" in text

    job = table_job(make_manifest_job, root, tmp_path / "results", entry)
    with pytest.raises(OutsideRootError) as err:
        run_stage("manifest", job)
    assert f"OutsideRootError: {err.value}".splitlines() == res.details  # the check showed the job's message
    assert not Path(job.output["manifest"]).exists()


def test_fault2_every_adapter_refuses_paths_outside_its_root(tmp_path):
    """The hand-written adapters go through the same wall (here the tvhl layout with a symlinked image)."""
    root = tmp_path / "tvhl"
    write_image(tmp_path / "elsewhere" / "1_OD_f_1.jpg", 0)
    (root / "EYE FUNDUS" / "EYE FUNDUS1").mkdir(parents=True)
    (root / "EYE FUNDUS" / "EYE FUNDUS1" / "1_OD_f_1.jpg").symlink_to(tmp_path / "elsewhere" / "1_OD_f_1.jpg")
    (root / "EYE FUNDUS.csv").write_text("Name,DME,DR,Size,Format\n1_OD_f_1,0,0,1,jpg\n")
    (root / "OCT.csv").write_text("Name,DME,DR,Size,Format\n")
    with pytest.raises(OutsideRootError, match=r"EYE FUNDUS\.csv:row 2: 'EYE FUNDUS/EYE FUNDUS1/1_OD_f_1\.jpg'"):
        adapt_tvhl(root, {"name": "tvhl"})


# --- fault 6: checks that pass, then a job that fails ---
def write_dh_layout(root: Path) -> Path:
    """A public-style layout tried as a new user would: `_DH` copies beside the originals (so an id taken from the
    number collides), label rows for images that are not there (004, 005), one image without a label row (006)."""
    for i, stem in enumerate(("001", "001_DH", "002", "002_DH", "003", "006")):
        write_image(root / "images" / f"{stem}.jpg", i)
    pd.DataFrame({"id": ["001", "002", "003", "004", "005"], "grade": ["0", "1", "0", "1", "1"]}).to_csv(
        root / "labels.csv", index=False)
    return root


@pytest.fixture
def dh_layout(tmp_path):
    data_root = tmp_path / "data"
    root = write_dh_layout(data_root / "own")
    entry = table_entry(listing={"glob": "images/*.jpg", "regex": r"images/(?P<id>\d+)(?:_DH)?\.jpg"},
                        join=[{"file": "labels.csv", "keys": {"id": "id"}, "columns": {"grade": "grade"}}],
                        image_id="{id}", labels={"g": {"column": "grade", "codes": {"0": "no", "1": "yes"}}})
    return data_root, root, {**entry, "index_files": ["labels.csv"]}


def test_fault6_check_reports_duplicate_ids_with_rows_files_count_and_fix(dh_layout, tmp_path, make_manifest_job):
    data_root, root, entry = dh_layout
    res = check_dataset("own", entry, data_root)
    text = "\n".join(res.details)
    assert res.status == "unreadable", format_checks([res])
    assert "2 image id(s) are shared by 4 rows" in text
    assert ("'001': listing images/*.jpg:row 1 (images/001.jpg); listing images/*.jpg:row 2 (images/001_DH.jpg)"
            in text)
    assert "'002': listing images/*.jpg:row 3 (images/002.jpg); listing images/*.jpg:row 4 (images/002_DH.jpg)" in text
    assert "Fix: give `table.image_id` a template" in text and "`table.duplicates: keep_first`" in text

    job = table_job(make_manifest_job, root, tmp_path / "results", entry)
    with pytest.raises(DuplicateImageIdError) as err:  # the job fails on exactly what the check reported
        run_stage("manifest", job)
    assert f"DuplicateImageIdError: {err.value}".splitlines() == res.details


def test_fault6_keep_first_and_unjoined_rows_are_counted_exclusions(dh_layout, tmp_path, make_manifest_job, capfd):
    data_root, root, entry = dh_layout
    entry = {**entry, "table": {**entry["table"], "duplicates": "keep_first"}}
    res = check_dataset("own", entry, data_root)
    text = "\n".join(res.details)
    assert res.status == "ok" and res.n_images == 4, format_checks([res])
    # counts printed by the check, one line per kind
    assert any(d.split()[:2] == ["image", "2"] and "duplicate image id" in d for d in res.details), text
    assert any(d.split()[:2] == ["image", "2"] and "row of labels.csv joins to no image" in d
               for d in res.details), text
    assert any(d.split()[:2] == ["label:g", "1"] and "no row in labels.csv for this image" in d
               for d in res.details), text

    job = table_job(make_manifest_job, root, tmp_path / "results", entry)
    run_stage("manifest", job)
    manifest = read_table(job.output["manifest"], "manifest")
    excl = read_table(job.output["exclusions"], "exclusions")
    assert sorted(manifest["path"]) == ["images/001.jpg", "images/002.jpg", "images/003.jpg", "images/006.jpg"]
    dup = excl[excl["reason"].str.startswith("duplicate image id")]
    assert sorted(dup["source"]) == ["listing images/*.jpg:row 2", "listing images/*.jpg:row 4"]
    assert list(dup["image_id"]) == ["001", "002"] and set(dup["scope"]) == {"image"}
    unjoined = excl[excl["reason"].str.contains("joins to no image")]
    assert sorted(unjoined["source"]) == ["labels.csv:row 5", "labels.csv:row 6"]  # ids 004 and 005
    assert set(unjoined["scope"]) == {"image"}
    out = capfd.readouterr().out
    assert "duplicate image id" in out and "row of labels.csv joins to no image" in out


@pytest.mark.parametrize("source, complaint", [
    ({"file": "labels.csv", "encodng": "latin-1"}, "'encodng' was unexpected"),
    ({"name": "labels"}, "'file' is a required property"),  # neither file nor listing
    ({"listing": {"glob": "*.jpg", "regexp": "x"}}, "'regexp' was unexpected"),
])
def test_fault6_the_registry_schema_validates_table_sources_items(tmp_path, source, complaint):
    import yaml

    from retinabench.registry import RegistryError, load_registry
    entry = {k: v for k, v in table_entry(sources=[source]).items() if k != "name"}
    path = tmp_path / "datasets.yaml"
    path.write_text(yaml.safe_dump({"own": entry}))
    with pytest.raises(RegistryError, match=r"datasets entry 'own', key table/sources/0[/a-z]*: .*" + complaint):
        load_registry(path, "datasets")


def test_fault6_the_documented_fix_runs_as_written(tmp_path):
    """docs/datasets.md's worked example (the table adapter) on the layout it describes prints what it promises."""
    import re

    import yaml
    docs = (Path(__file__).resolve().parents[1] / "docs" / "datasets.md").read_text()
    section = docs[docs.index("### Worked example: copies beside the originals"):]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    entry = {"name": "mystudy", **yaml.safe_load(block)["mystudy"]}
    write_dh_layout(tmp_path / "mystudy")
    res = check_dataset("mystudy", entry, tmp_path)
    assert res.status == "ok" and res.n_images == 4, format_checks([res])
    printed = [" ".join(d.split()) for d in res.details]
    promised = " ".join(section.split())
    for claim in ("image 2 duplicate image id: an earlier row has this id and is kept (duplicates: keep_first)",
                  "image 2 row of labels.csv joins to no image: no source row has its id",
                  "label:g 1 no row in labels.csv for this image"):
        assert f"`{claim}`" in promised and claim in printed


# --- fault 7: raw tracebacks and misleading errors ---
def test_fault7_latin1_index_names_file_encoding_and_offset_and_reads_with_encoding(tmp_path):
    root = tmp_path / "own"
    write_image(root / "img" / "a.jpg", 0)
    write_image(root / "img" / "b.jpg", 1)
    (root / "labels.csv").write_bytes("file,grade,site\na,0,Gen\u00e8ve\nb,1,Z\u00fcrich\n".encode("latin-1"))
    entry = table_entry(sources=[{"file": "labels.csv"}], image={"template": "img/{file}.jpg"}, image_id="{file}",
                        site={"column": "site"}, labels={"g": {"column": "grade", "codes": {"0": "no", "1": "yes"}}})
    with pytest.raises(IndexFileError) as err:
        plan(root, entry)
    msg = str(err.value)
    assert str(root / "labels.csv") in msg and "is not utf-8-sig text" in msg
    assert "byte 23 (line 2) is 0xe8" in msg and "'a,0,Genève'" in msg and "`encoding: latin-1`" in msg
    res = check_dataset("own", {**entry, "index_files": ["labels.csv"]}, tmp_path)
    assert res.status == "unreadable" and res.details[0].startswith("IndexFileError: dataset 'own': index file")

    entry["table"]["sources"][0]["encoding"] = "latin-1"
    m, _ = adapt_table(root, entry)
    assert dict(zip(m["image_id"], m["site"])) == {"a": "Genève", "b": "Zürich"}

    tvhl = tmp_path / "tvhl"  # a hand-written adapter reads through the same reader
    (tvhl / "EYE FUNDUS").mkdir(parents=True)
    (tvhl / "EYE FUNDUS.csv").write_bytes("Name,DME,DR\n1_OD_f_1,0,\u00e9\n".encode("latin-1"))
    (tvhl / "OCT.csv").write_text("Name,DME,DR\n")
    with pytest.raises(IndexFileError, match=r"EYE FUNDUS\.csv is not utf-8-sig text: byte 23 \(line 2\).*"
                                             r"re-save the file as UTF-8"):
        adapt_tvhl(tvhl, {"name": "tvhl"})


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_fault7_empty_index_file_is_an_error_naming_it(tmp_path, content):
    root = tmp_path / "own"
    write_image(root / "img" / "a.jpg", 0)
    (root / "labels.csv").write_bytes(content)
    entry = table_entry(sources=[{"file": "labels.csv"}], image={"template": "img/{file}.jpg"})
    with pytest.raises(IndexFileError, match=rf"index file {root / 'labels.csv'} is empty \("):
        plan(root, entry)
    (root / "labels.xlsx").write_bytes(b"")
    with pytest.raises(IndexFileError, match=r"labels\.xlsx is empty \(0 bytes\)"):
        plan(root, table_entry(sources=[{"file": "labels.xlsx"}], image={"template": "img/{file}.jpg"}))


def test_fault7_task_whose_modality_lost_every_image_names_task_modality_and_exclusions(tmp_path):
    """OCT rows whose images are all missing: the OCT task's error says so, with the exclusion counts."""
    root = tmp_path / "own"
    rows = []
    for p in range(24):
        write_image(root / "cfp" / f"c{p}.jpg", p)
        rows.append((f"cfp/c{p}.jpg", f"p{p}", "cfp", str(p % 2)))
        rows.append((f"oct/o{p}.jpg", f"p{p}", "oct", str(p % 2)))  # never written: every OCT image is missing
    pd.DataFrame(rows, columns=["file", "pid", "mod", "grade"]).to_csv(root / "labels.csv", index=False)
    entry = table_entry(sources=[{"file": "labels.csv"}], image={"column": "file"},
                        modality={"column": "mod"}, patient={"column": "pid"},
                        labels={"g": {"column": "grade", "codes": {"0": "no", "1": "yes"}}})
    manifest, exclusions = adapt_table(root, entry)
    tasks = [{"name": f"own_{m}_g", "dataset": "own", "modality": m, "label": "g", "classes": ["no", "yes"],
              "ordinal": False} for m in ("cfp", "oct")]
    assignment, _ = assign_splits(manifest, tasks, seed=0, dataset="own")
    assert len(task_split(manifest, assignment, tasks[0], exclusions=exclusions))
    with pytest.raises(SplitError) as err:
        task_split(manifest, assignment, tasks[1], exclusions=exclusions)
    msg = str(err.value)
    assert msg.startswith("task 'own_oct_g': dataset 'own' has no oct images left after exclusions")
    assert "manifest images by modality: cfp 24" in msg
    assert "the dataset's image exclusions by reason:\n  image       24  image file not found: …" in msg
    assert "fraction" not in msg and "more patients" not in msg


def test_fault7_dataset_whose_only_modality_lost_every_image_fails_its_manifest_job_with_the_counts(
        tmp_path, make_manifest_job):
    """When nothing reaches the manifest, the manifest job (which holds the exclusions) says why, instead of the
    split job failing later on "fewer groups than splits"."""
    root = tmp_path / "own"
    root.mkdir()
    pd.DataFrame({"file": [f"img/{k}.jpg" for k in range(5)], "grade": ["0"] * 5}).to_csv(
        root / "labels.csv", index=False)
    entry = {**table_entry(sources=[{"file": "labels.csv"}], image={"column": "file"},
                           labels={"g": {"column": "grade", "codes": {"0": "no"}}}), "index_files": ["labels.csv"]}
    job = table_job(make_manifest_job, root, tmp_path / "results", entry)
    with pytest.raises(ValueError) as err:
        run_stage("manifest", job)
    msg = str(err.value)
    assert msg.startswith("dataset 'own': no image reached the manifest (['cfp'] declared)")
    missing = [line.split() for line in msg.splitlines() if "image file not found" in line]
    assert len(missing) == 5 and all(words[:2] == ["image", "1"] for words in missing)  # one line per file
    assert not Path(job.output["manifest"]).exists()
