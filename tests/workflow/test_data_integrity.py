"""Data integrity in the workflow: one split per dataset, summaries on the console, config refused at start,
raw changes rerun the manifest, adding a dataset reruns nothing."""
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from retinabench.provenance import read_sidecar
from retinabench.schemas import read_table

pytestmark = pytest.mark.slow


def job_counts(stdout):
    if "Job stats:" not in stdout:
        return {}
    return {line.split()[0]: int(line.split()[1]) for line in stdout.split("Job stats:")[1].splitlines()[3:]
            if len(line.split()) == 2 and line.split()[1].isdigit()}


def nothing_to_do(out):
    text = out.stdout + out.stderr
    return "Nothing to be done" in text or job_counts(out.stdout) == {"total": 0}


def edited_copy(src, dest, config=None, registry=None):
    shutil.copytree(src, dest, symlinks=True)
    if config:
        path = dest / "config/tiny.yaml"
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **config}))
    for name, entries in (registry or {}).items():  # appended: the existing entries keep their order
        with open(dest / f"config/{name}.yaml", "a") as fh:
            fh.write("\n" + yaml.safe_dump(entries))
    return dest


def test_every_task_uses_its_datasets_one_split_and_summaries_reach_the_console(tiny_workflow):
    r = tiny_workflow / "results"
    assignment = read_table(r / "splits/phantom.parquet", "dataset_split")
    where = dict(zip(assignment["image_id"], assignment["split"]))
    for path in (r / "splits/phantom").glob("*.parquet"):
        split = read_table(path, "split")
        assert (split["split"] == split["image_id"].map(where)).all(), path.name
    side = read_sidecar(r / "splits/phantom.parquet")["extra"]["summary"]
    assert {"groups_merging_patients", "realised_fractions", "tolerance", "class_presence_moves"} <= set(side)
    assert read_table(r / "data/phantom/duplicates.parquet", "duplicates").columns[0] == "cluster_id"
    log = (tiny_workflow / "run.log").read_text()
    for needle in ("retinabench manifest phantom:", "decode pass:", "retinabench duplicates phantom:",
                   "retinabench split phantom (hash, seed 0):"):
        assert needle in log, needle
    assert "exclusions by scope and reason:" in (r / "logs/manifest/phantom.log").read_text()


def test_bad_settings_are_refused_by_a_dry_run_with_every_reason(tiny_workflow, tmp_path, run_snakemake):
    # what the config alone cannot tell: unpinned encoders, a device missing where the jobs run (the config's own
    # problems, e.g. fractions that do not sum to 1, are retinabench.settings': tests/workflow/test_config_errors.py)
    work = edited_copy(tiny_workflow, tmp_path / "a", {
        "encoders": ["efficientnet_lite0_in1k", "dinov2_vitb14"],
        "features": {"batch_size": 64, "device": "cuda:7"}})
    out = run_snakemake(work, "-n", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Nothing to be done" not in text
    for needle in ("encoder 'dinov2_vitb14' is not locked", "features.device: 'cuda:7'"):
        assert needle in text, text[-3000:]
    work = edited_copy(tiny_workflow, tmp_path / "b", {"knn": {"k": 100000, "temperature": 0.07}})
    out = run_snakemake(work, "-n", check=False)
    assert out.returncode != 0 and "knn.k = 100000 but task 'phantom_cfp_dr3' has" in out.stdout + out.stderr


def test_adding_a_dataset_its_adapter_entry_and_tasks_reruns_nothing(tiny_workflow, tmp_path, run_snakemake):
    work = edited_copy(tiny_workflow, tmp_path / "c", registry={
        "datasets": {"newset": {"adapter": "tvhl", "root": "newset", "index_files": ["EYE FUNDUS.csv"],
                                "modalities": ["cfp"], "web_exposure_risk": "low"}},
        "tasks": {"newset_cfp_dme": {"dataset": "newset", "modality": "cfp", "label": "dme",
                                     "classes": ["no", "yes"], "ordinal": False, "family": "dme"}}})
    out = run_snakemake(work, "-n")
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]


@pytest.fixture(scope="module")
def raw_run(tiny_workflow, tmp_path_factory, run_snakemake, make_workflow_copy):
    """The data stage (manifest .. task splits) of a non-generated copy of the tiny run's phantom raw folder."""
    base = tmp_path_factory.mktemp("raw")
    shutil.copytree(tiny_workflow / "results/raw/phantom", base / "data/phantom_raw", copy_function=shutil.copy2)
    entry = yaml.safe_load((tiny_workflow / "config/datasets.yaml").read_text())["phantom"]
    entry = {k: v for k, v in entry.items() if k != "generated"} | {"root": "phantom_raw"}
    tasks = yaml.safe_load((tiny_workflow / "config/tasks.yaml").read_text())
    work = make_workflow_copy(base / "repo", {"datasets": ["phantom_raw"], "data_root": str(base / "data"),
                                              "encoders": ["vit_tiny_random"]})
    with open(work / "config/datasets.yaml", "a") as fh:
        fh.write(yaml.safe_dump({"phantom_raw": entry}))
    with open(work / "config/tasks.yaml", "a") as fh:
        fh.write(yaml.safe_dump({f"raw_{k}": {**v, "dataset": "phantom_raw"} for k, v in tasks.items()
                                 if v["dataset"] == "phantom" and not v.get("derive")}))
    run_snakemake(work, "--until", "task_split")
    return work, base / "data/phantom_raw"


def test_a_changed_raw_image_reruns_its_manifest_and_is_marked_in_provenance(raw_run, run_snakemake):
    work, raw = raw_run
    assert nothing_to_do(run_snakemake(work, "-n", "--until", "task_split"))
    image = sorted((raw / "cfp").glob("*.png"))[0]
    st = image.stat()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))  # touched, same bytes: nothing reruns
    out = run_snakemake(work, "-n", "--until", "task_split")
    assert nothing_to_do(out), out.stdout[-3000:]
    with open(image, "ab") as fh:
        fh.write(b"\0")  # one byte appended
    out = run_snakemake(work, "-n", "--until", "task_split")
    jobs = job_counts(out.stdout)
    assert jobs.get("manifest") == 1 and jobs.get("split") == 1, out.stdout[-3000:]
    assert "raw data of phantom_raw changed since its manifest was built: 1 changed" in out.stderr
    cli = [sys.executable, "-m", "retinabench", "provenance", "results/splits/phantom_raw/raw_phantom_cfp_dr3.parquet"]
    prov = subprocess.run(cli, cwd=work, capture_output=True, text=True)
    chain = prov.stdout
    assert prov.returncode == 1, prov.stderr  # provenance exits 1 when it flags anything
    assert "[CHANGED since used] raw image" in chain and f"cfp/{image.name} (changed)" in chain, chain
    verify = subprocess.run([sys.executable, "-m", "retinabench", "verify", "phantom_raw", "--configfile",
                             "config/tiny.yaml"], cwd=work, capture_output=True, text=True)
    assert verify.returncode == 1 and f"CHANGED  {raw / 'cfp' / image.name}  raw file of phantom_raw" in verify.stdout, verify.stdout + verify.stderr
