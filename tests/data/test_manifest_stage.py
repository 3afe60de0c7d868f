"""The manifest job on small corrupted / changed copies of tvhl: decode pass, corrupt images, subsample, raw
changes (fingerprint, verify, provenance), exclusions summary, and no leftovers after a failed job."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retinabench.data.image_cache import build_image_cache
from retinabench.data.image_checks import CorruptImageError
from retinabench.data.raw_state import RawState
from retinabench.provenance import format_chain, read_sidecar
from retinabench.schemas import read_table
from retinabench.pipeline import run_stage

pytestmark = pytest.mark.shared
REPO = Path(__file__).resolve().parents[2]


def images(root, folder, n):
    return sorted((root / folder).glob("*/*.jpg"))[:n]


def corrupt(root):
    """Three broken files: truncated JPEG, garbage bytes, empty file."""
    a, b = images(root, "EYE FUNDUS", 2)
    c = images(root, "OCT", 1)[0]
    a.write_bytes(a.read_bytes()[: a.stat().st_size // 3])
    b.write_bytes(b"this is not a JPEG" * 50)
    c.write_bytes(b"")
    return [a, b, c]


def leftovers(results):
    return sorted(p.name for p in (results / "data").rglob("*") if p.is_file()
                  and (p.name.endswith(".prov.json") or ".tmp" in p.name or p.suffix == ".parquet"
                       and not p.name.startswith(".")))


def test_every_corrupt_image_is_listed_and_a_failed_job_leaves_nothing(tvhl_copy, tmp_path, make_manifest_job):
    bad = corrupt(tvhl_copy)
    job = make_manifest_job(tvhl_copy, tmp_path / "results")
    stale = Path(job.output["manifest"] + ".prov.json")  # a sidecar of an earlier run's (deleted) output
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    with pytest.raises(CorruptImageError) as err:
        run_stage("manifest", job)
    msg = str(err.value)
    assert "3 image(s) cannot be decoded" in msg
    for path in bad:
        assert str(path.relative_to(tvhl_copy)) in msg
    assert "on_corrupt: exclude" in msg
    assert leftovers(tmp_path / "results") == []


def test_on_corrupt_exclude_records_them_and_the_summary_is_printed(tvhl_copy, tmp_path, make_manifest_job, capfd):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    n_all = len(adapt_tvhl(tvhl_copy, {"name": "tvhl"})[0])
    bad = corrupt(tvhl_copy)
    job = make_manifest_job(tvhl_copy, tmp_path / "results", {"on_corrupt": "exclude"})
    run_stage("manifest", job)
    manifest = read_table(job.output["manifest"], "manifest")
    excl = read_table(job.output["exclusions"], "exclusions")
    rel = {str(p.relative_to(tvhl_copy)) for p in bad}
    assert not rel & set(manifest["path"]) and len(manifest) == n_all - 3
    corrupt_rows = excl[excl["reason"].str.startswith("corrupt image: ")]
    assert set(corrupt_rows["source"]) == rel and set(corrupt_rows["scope"]) == {"image"}
    hashes = read_table(job.output["hashes"], "image_hashes")
    assert list(hashes["image_id"]) == sorted(manifest["image_id"]) and hashes["phash"].str.len().eq(64).all()
    out, err = capfd.readouterr()
    for text in (out, err):  # the job's log (stdout) and the console
        assert f"retinabench manifest tvhl: {n_all - 3} images" in text and "exclusions by scope and reason:" in text
        assert "corrupt image" in text and "label:dr3" in text
    side = read_sidecar(job.output["manifest"])
    assert side["extra"]["summary"]["decode"]["corrupt"] == 3


def test_decode_pass_is_cached_by_sha256(tvhl_copy, tmp_path, make_manifest_job):
    job = make_manifest_job(tvhl_copy, tmp_path / "results")
    run_stage("manifest", job)
    n = read_table(job.output["manifest"], "manifest")["sha256"].nunique()
    assert read_sidecar(job.output["manifest"])["extra"]["summary"]["decode"] == {"decoded": n, "cached": 0,
                                                                                  "corrupt": 0}
    img = images(tvhl_copy, "OCT", 1)[0]
    from PIL import Image
    Image.open(img).save(img, quality=70)  # same image, new bytes
    run_stage("manifest", job)
    summary = read_sidecar(job.output["manifest"])["extra"]["summary"]
    assert summary["decode"] == {"decoded": 1, "cached": n - 1, "corrupt": 0}
    assert summary["sha256_reused"] >= n - 1  # unchanged files were not re-hashed either


def test_image_cache_lists_every_unreadable_image_and_leaves_no_temp_file(tvhl_copy, tmp_path):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    manifest, _ = adapt_tvhl(tvhl_copy, {"name": "tvhl"})
    bad = corrupt(tvhl_copy)
    out = tmp_path / "cache" / "images_32_squash.npy"
    with pytest.raises(OSError, match="3 image\\(s\\) cannot be read") as err:
        build_image_cache(manifest, tvhl_copy, out, tmp_path / "cache" / "index.parquet", size=32, progress=False)
    for p in bad:
        assert str(p) in str(err.value)
    assert list((tmp_path / "cache").iterdir()) == []


def test_subsample_is_seeded_by_patient_keeps_both_eyes_and_is_recorded(tvhl_copy, tmp_path, make_manifest_job):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    full, _ = adapt_tvhl(tvhl_copy, {"name": "tvhl"})
    kept = {}
    for n in (4, 8):
        job = make_manifest_job(tvhl_copy, tmp_path / f"r{n}", {"subsample": {"patients": n, "seed": 3}})
        run_stage("manifest", job)
        m = read_table(job.output["manifest"], "manifest")
        kept[n] = set(m["patient_id"])
        assert len(kept[n]) == n
        assert len(m) == full["patient_id"].isin(kept[n]).sum()  # every image (both eyes, both modalities)
        excl = read_table(job.output["exclusions"], "exclusions")
        sub = excl[excl["reason"].str.startswith("subsample: patient not drawn")]
        assert len(sub) == len(full) - len(m)
        side = read_sidecar(job.output["manifest"])
        assert side["config"]["dataset"]["subsample"] == {"patients": n, "seed": 3}
        assert side["extra"]["summary"]["subsample"]["patients_kept"] == n
    assert kept[4] < kept[8]  # nested: a larger subsample contains the smaller one


def test_raw_fingerprint_sees_changes_but_not_touches(tvhl_copy, tmp_path):
    state = RawState(tvhl_copy, tmp_path / "data")
    assert state.refresh()["rewritten"]  # first scan
    first = state.fingerprint_path.stat().st_mtime_ns
    assert not state.refresh()["rewritten"]
    img = images(tvhl_copy, "EYE FUNDUS", 1)[0]
    import hashlib
    from retinabench import hashing
    hashing.remember(img, img.stat().st_size, img.stat().st_mtime_ns, hashlib.sha256(img.read_bytes()).hexdigest())
    state.record()  # as the manifest job does: digests of the files it read
    os.utime(img, ns=(img.stat().st_atime_ns, img.stat().st_mtime_ns + 10**9))  # touch: same bytes
    r = state.refresh()
    assert r["touched"] == 1 and not r["rewritten"] and state.fingerprint_path.stat().st_mtime_ns == first
    with open(img, "ab") as fh:
        fh.write(b"\0")  # one byte appended
    r = state.refresh()
    assert r["changed"] == [str(img.relative_to(tvhl_copy))] and r["rewritten"]
    (tvhl_copy / "OCT" / "new.jpg").write_bytes(b"x")
    images(tvhl_copy, "OCT", 1)[0].unlink()
    r = state.refresh()
    assert r["added"] == ["OCT/new.jpg"] and len(r["removed"]) == 1 and r["rewritten"]


def test_verify_and_provenance_name_a_changed_image(tvhl_copy, tmp_path, make_manifest_job):
    results = tmp_path / "results"
    job = make_manifest_job(tvhl_copy, results)
    run_stage("manifest", job)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data_root": str(tvhl_copy.parent), "results": str(results),
                                   "datasets": ["tvhl"], "tasks": []}))
    cli = [sys.executable, "-m", "retinabench", "verify", "tvhl", "--configfile", str(cfg)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    ok = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "70 images" in ok.stdout, ok.stdout + ok.stderr
    assert "CHANGED" not in format_chain(job.output["manifest"])
    img = images(tvhl_copy, "OCT", 1)[0]
    rel = str(img.relative_to(tvhl_copy))
    with open(img, "ab") as fh:
        fh.write(b"\0")
    (tvhl_copy / "OCT" / "extra.jpg").write_bytes(b"x")
    bad = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"CHANGED  {tvhl_copy / rel}  raw file of tvhl image oct_{img.stem} sha256" in bad.stdout, bad.stdout
    assert f"ADDED    {tvhl_copy / 'OCT/extra.jpg'}  raw file of tvhl" in bad.stdout
    chain = format_chain(job.output["manifest"])
    assert f"[CHANGED since used] raw image oct_{img.stem}: {rel} (changed)" in chain


def test_stage_chain_duplicates_split_task_views_and_cross_dataset_pairs(tvhl_copy, tmp_path, make_manifest_job,
                                                                         registries):
    """manifest -> duplicates -> one dataset split -> task views, for two datasets holding the same images."""
    import shutil
    from retinabench.pipeline import Job
    from retinabench.plan.selection import dataset_tasks
    other = tmp_path / "data" / "tvhl2"
    shutil.copytree(tvhl_copy, other)
    results = tmp_path / "results"
    r = results / "data"
    for name, root in (("tvhl", tvhl_copy), ("tvhl2", other)):
        run_stage("manifest", make_manifest_job(root, results, {"name": name}, dataset=name))
        run_stage("duplicates", Job(rule="duplicates", input={"manifest": str(r / name / "manifest.parquet"),
                                                              "hashes": str(r / name / "image_hashes.parquet")},
                                    output={"duplicates": str(r / name / "duplicates.parquet")},
                                    params={"duplicates": {"max_distance": 8}}, wildcards={"dataset": name}))
        run_stage("split", Job(rule="split", input={"manifest": str(r / name / "manifest.parquet"),
                                                    "duplicates": str(r / name / "duplicates.parquet")},
                               output={"split": str(results / "splits" / f"{name}.parquet")},
                               params={"split": {"fractions": {"train": 0.7, "val": 0.15, "test": 0.15}, "seed": 0},
                                       "tasks": [t | {"dataset": name} for t in dataset_tasks(registries, "tvhl")]},
                               wildcards={"dataset": name}))
    task = registries.task("tvhl_cfp_dme")
    job = Job(rule="task_split", input={"manifest": str(r / "tvhl/manifest.parquet"),
                                        "exclusions": str(r / "tvhl/exclusions.parquet"),
                                        "assignment": str(results / "splits/tvhl.parquet")},
              output={"split": str(results / "splits/tvhl/tvhl_cfp_dme.parquet")},
              params={"task": task, "seed": 0}, wildcards={"dataset": "tvhl", "task": task["name"]})
    run_stage("task_split", job)
    view = read_table(job.output["split"], "split")
    assignment = read_table(results / "splits/tvhl.parquet", "dataset_split")
    assert (view["split"] == view["image_id"].map(dict(zip(assignment["image_id"], assignment["split"])))).all()
    side = read_sidecar(results / "splits/tvhl.parquet")
    assert "groups_merging_patients" in side["extra"]["summary"] and side["config"]["tasks"]
    pairs_path = r / "cross_dataset_duplicates.parquet"
    run_stage("cross_duplicates", Job(
        rule="cross_duplicates",
        input={"hashes": [str(r / d / "image_hashes.parquet") for d in ("tvhl", "tvhl2")],
               "splits": [str(results / "splits" / f"{d}.parquet") for d in ("tvhl", "tvhl2")]},
        output={"pairs": str(pairs_path)}, params={"duplicates": {"max_distance": 8}, "datasets": ["tvhl", "tvhl2"]}))
    pairs = read_table(pairs_path, "cross_duplicates")
    manifest = read_table(r / "tvhl/manifest.parquet", "manifest")
    exact = pairs[pairs["kind"] == "exact"]  # every image has its copy (and identical images each other's)
    same = exact[exact["image_a"] == exact["image_b"]]
    assert len(same) == len(manifest) and (same["split_a"] == same["split_b"]).all()  # same seed, same groups
