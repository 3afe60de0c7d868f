"""split.method file: published split files (csv, FOCUS's Split_Data, RETFound's ImageFolder) reproduced exactly
and checked for leakage (retinabench.data.split_file)."""
import numpy as np
import pandas as pd
import pytest

from retinabench.data.split_file import LEAK_ALLOWED, split_inputs, split_source
from retinabench.data.splits import SplitError, assign_splits, task_split

TASK = {"name": "dr", "dataset": "idrid", "label": "dr", "classes": ["no", "yes"], "modality": "cfp"}


def manifest(n=60, names=lambda p, k: f"IDRiD_{p:03d}_{k}"):
    """n patients with two images each (ids prefixed as an adapter would; files named as the study names them)."""
    rng = np.random.default_rng(0)
    rows = []
    for p in range(n):
        for k in range(2):
            name = names(p, k)
            rows.append({"image_id": f"cfp_{name}", "patient_id": f"P{p}", "modality": "cfp", "dataset": "idrid",
                         "path": f"B. Disease Grading/1. Original Images/a. Training Set/{name}.jpg",
                         "dr": rng.choice(["no", "yes"]), "sha256": name.ljust(64, "0")})
    return pd.DataFrame(rows)


def study_split(m, seed=1, parts=("train", "val", "test"), p=(0.6, 0.2, 0.2)):
    """The study's assignment: per patient, at random (what a released file holds)."""
    rng = np.random.default_rng(seed)
    per = {pid: rng.choice(parts, p=p[:len(parts)] / np.sum(p[:len(parts)])) for pid in sorted(set(m["patient_id"]))}
    return m["patient_id"].map(per)


def focus_csv(tmp_path, m, split, name="labels_splits_idrid.csv"):
    """A Split_Data CSV exactly as FOCUS publishes it (scripts/create_dataset_splits.py's column order)."""
    stem = m["path"].str.rsplit("/", n=1).str[-1].str.replace(".jpg", "", regex=False)
    df = pd.DataFrame({"dataset": "idrid", "image_id": stem, "split": split,
                       "image_path": "/lustre/fsn1/datasets/IDRiD/" + m["path"],
                       "Task_DR_Binary": (m["dr"] == "yes").astype(int), "Task_Referable": "",
                       "Task_Glaucoma": ""})
    (tmp_path / "Split_Data").mkdir(exist_ok=True)
    path = tmp_path / "Split_Data" / name
    df.to_csv(path, index=False)
    return path


def run(m, file, **kw):
    return assign_splits(m, [TASK], method="file", dataset="idrid", file=file, **kw)


def test_focus_split_data_file_is_reproduced_exactly(tmp_path):
    m = manifest()
    want = study_split(m)
    path = focus_csv(tmp_path, m, want)
    assert pd.read_csv(path).columns.tolist() == ["dataset", "image_id", "split", "image_path", "Task_DR_Binary",
                                                  "Task_Referable", "Task_Glaucoma"]
    a, rep = run(m, {"format": "focus_split_data", "files": {"idrid": str(path)}})
    got = a.set_index("image_id")["split"].reindex(m["image_id"]).to_numpy()
    assert (got == want.to_numpy()).all() and set(a["placed_by"]) == {"file"}
    assert rep["match"] == "stem" and rep["unknown_rows_excluded"] == rep["unlisted_images_excluded"] == 0
    s = task_split(m, a, TASK)
    assert len(s) == len(m) and (s.set_index("image_id")["split"] == a.set_index("image_id")["split"]).all()


def test_focus_mbrset_layout_file_column_and_train_test_only_with_val_carved(tmp_path):
    m = manifest(80, names=lambda p, k: f"{p}.{2 * k + 1}")  # mBRSET: 1.1.jpg, 1.3.jpg
    want = study_split(m, parts=("train", "test"), p=(0.6, 0.4))
    df = pd.DataFrame({"patient": m["patient_id"].str[1:], "file": m["path"].str.rsplit("/", n=1).str[-1],
                       "split": want.replace({"train": "training"})})  # FOCUS's loader maps training -> train
    path = tmp_path / "labels_splits_mbrset.csv"
    df.to_csv(path, index=False)
    settings = {"format": "focus_split_data", "files": {"idrid": str(path)}}
    with pytest.raises(SplitError, match=r"has no val rows .* set split.file.val_from_train"):
        run(m, settings)
    a, rep = run(m, settings | {"val_from_train": 0.2})
    got = a.set_index("image_id")["split"].reindex(m["image_id"])
    assert (got[want.to_numpy() == "test"] == "test").all()  # the file's test is untouched
    carved = got[want.to_numpy() == "train"]
    assert set(carved) == {"train", "val"} and 0.1 < (carved == "val").mean() < 0.3
    assert rep["val_carved_from_train"] == int((carved == "val").sum())
    assert a.groupby("patient_id")["split"].nunique().max() == 1


def test_imagefolder_layout_is_reproduced(tmp_path):
    m = manifest()
    want = study_split(m, seed=4)
    root = tmp_path / "IDRiD"
    for (_, row), split in zip(m.iterrows(), want):
        d = root / split / row["dr"]
        d.mkdir(parents=True, exist_ok=True)
        (d / row["path"].rsplit("/", 1)[-1]).write_bytes(b"")
    a, rep = run(m, {"format": "imagefolder", "files": {"idrid": str(root)}})
    assert rep["match"] == "name"
    assert (a.set_index("image_id")["split"].reindex(m["image_id"]).to_numpy() == want.to_numpy()).all()
    before = split_source({"method": "file", "file": {"files": {"idrid": str(root)}}}, "idrid")["sha256"]
    (root / "test" / "no" / "extra.jpg").write_bytes(b"")
    assert split_source({"method": "file", "file": {"files": {"idrid": str(root)}}}, "idrid")["sha256"] != before


def test_a_patient_in_two_splits_names_patient_and_rows_unless_its_count_is_allowed(tmp_path):
    m = manifest()
    split = study_split(m)
    i = m.index[m["patient_id"] == "P5"]
    split[i[0]], split[i[1]] = "train", "test"
    path = focus_csv(tmp_path, m, split)
    file = {"format": "focus_split_data", "files": {"idrid": str(path)}}
    with pytest.raises(SplitError, match=r"1 patient groups .* in two splits, split.file.allowed_leaks is 0; e.g. "
                                         r"patient P5: cfp_IDRiD_005_0 train \(labels_splits_idrid.csv line \d+\)"):
        run(m, file)
    with pytest.raises(SplitError, match="allowed_leaks is 2"):
        run(m, file | {"allowed_leaks": 2})
    a, rep = run(m, file | {"allowed_leaks": 1})
    assert rep["allowed_leaks"] == 1 and set(a.loc[a["placed_by"] == LEAK_ALLOWED, "patient_id"]) == {"P5"}
    assert task_split(m, a, TASK)["patient_id"].eq("P5").sum() == 2  # the recorded leak passes the task checks


def test_identical_images_across_patients_count_as_a_leak(tmp_path):
    m = manifest()
    split = study_split(m)
    a_i, b_i = m.index[m["patient_id"] == "P1"][0], m.index[m["patient_id"] == "P2"][0]
    m.loc[b_i, "sha256"] = m.loc[a_i, "sha256"]
    split[m["patient_id"] == "P1"], split[m["patient_id"] == "P2"] = "train", "val"
    path = focus_csv(tmp_path, m, split)
    with pytest.raises(SplitError, match="patient P1, P2"):
        run(m, {"format": "focus_split_data", "files": {"idrid": str(path)}})


def test_missing_and_unknown_rows_are_errors_or_counted_exclusions(tmp_path):
    m = manifest()
    split = study_split(m)
    path = focus_csv(tmp_path, m.iloc[2:], split.iloc[2:])  # the first patient's images are not in the file
    extra = pd.read_csv(path, dtype=str, keep_default_na=False)
    extra.loc[len(extra)] = ["idrid", "IDRiD_999", "test", "/x/IDRiD_999.jpg", "1", "", ""]
    extra.loc[extra["image_id"] == "IDRiD_010_0", "split"] = "all"  # FOCUS: unsplit (evaluation only)
    extra.to_csv(path, index=False)
    file = {"format": "focus_split_data", "files": {"idrid": str(path)}}
    with pytest.raises(SplitError, match=r"1 rows name no manifest image in .*, e.g. IDRiD_999 \(labels_splits_idrid"
                                         r".csv line 120\)"):
        run(m, file)
    with pytest.raises(SplitError, match=r"3 manifest images are not placed .* e.g. \['cfp_IDRiD_000_0', "
                                         r"'cfp_IDRiD_000_1', 'cfp_IDRiD_010_0'\]"):
        run(m, file | {"unknown": "exclude"})
    a, rep = run(m, file | {"unknown": "exclude", "unlisted": "exclude"})
    assert rep["unknown_rows_excluded"] == 1 and rep["unlisted_images_excluded"] == 3
    assert (a["split"] == "none").sum() == 3
    assert len(task_split(m, a, TASK)) == len(m) - 3


def test_conflicting_rows_bad_values_and_missing_entries_are_clear_errors(tmp_path):
    m = manifest()
    path = focus_csv(tmp_path, m, study_split(m))
    df = pd.read_csv(path)
    twice = pd.concat([df, df.iloc[[3]].assign(split="test" if df.loc[3, "split"] != "test" else "train")])
    twice.to_csv(path, index=False)
    file = {"format": "focus_split_data", "files": {"idrid": str(path)}}
    with pytest.raises(SplitError, match=r"image cfp_IDRiD_001_1 is listed in splits .* \(rows labels_splits_idrid"
                                         r".csv line 5, labels_splits_idrid.csv line 122"):
        run(m, file)
    df.assign(split=df["split"].replace({"val": "dev"})).to_csv(path, index=False)
    with pytest.raises(SplitError, match=r"split values \['dev'\] are not train / val / test"):
        run(m, file)
    with pytest.raises(SplitError, match="split.file.files has no entry for dataset 'idrid'"):
        run(m, {"format": "csv", "files": {}})
    with pytest.raises(SplitError, match=r"no column \['img'\]"):
        run(m, {"format": "csv", "files": {"idrid": str(path)}, "image_column": "img"})


def test_plain_csv_with_named_columns_and_the_job_inputs(tmp_path):
    m = manifest()
    want = study_split(m)
    path = tmp_path / "released.csv"
    pd.DataFrame({"file": m["image_id"], "fold": want.str.upper()}).to_csv(path, index=False)
    a, _ = run(m, {"format": "csv", "files": {"idrid": str(path)}, "image_column": "file", "split_column": "fold"})
    assert (a.set_index("image_id")["split"].reindex(m["image_id"]).to_numpy() == want.to_numpy()).all()
    split = {"method": "file", "file": {"files": {"idrid": str(path)}}}
    assert split_inputs(split, "idrid") == [str(path)] and split_inputs({"method": "hash"}, "idrid") == []
    sha = split_source(split, "idrid")["sha256"]
    path.write_text(path.read_text().replace("TRAIN", "TEST", 1))
    assert split_source(split, "idrid")["sha256"] != sha and split_source({"method": "hash"}, "idrid") == {}
