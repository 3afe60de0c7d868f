"""Issue 23, "Nothing changes a result silently": each of its nine faults reproduced as a hostile or unlucky user met
it, on generated fixtures (no downloads), with the behaviour that replaces it: a clear error naming the file, row,
writer and fix, or a recorded and printed count. One section per fault, in the issue's order; the workflow-level
tests reuse the session's tiny run (tests/workflow/conftest.py) through copies."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from retinabench.data.adapters.image_ids import DuplicateImageIdError
from retinabench.data.adapters.index_text import IndexFileError
from retinabench.data.adapters.root_wall import OutsideRootError
from retinabench.data.adapters.table import adapt_table, plan
from retinabench.data.adapters.tvhl import adapt_tvhl
from retinabench.data.check import check_dataset, format_checks
from retinabench.testing.raw_files import write_image
from retinabench.data.splits import SplitError, assign_splits, task_split
from retinabench.pipeline import Job, run_stage
from retinabench.provenance import read_sidecar
from retinabench.schemas import read_table

REPO = Path(__file__).resolve().parents[2]


def cli(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retinabench", *args], cwd=work, capture_output=True, text=True,
                          timeout=600)


def rewrite_keeping_mtime(path: Path, change) -> None:
    """Rewrite a file in place as `cp -p` / `touch -r` would leave it: same path, same inode, old mtime."""
    st = path.stat()
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def permute_rows(path: Path) -> None:
    table = pd.read_parquet(path)
    table.iloc[::-1].reset_index(drop=True).to_parquet(path, index=False)  # same schema, rows reversed


def sidecar_job(tmp_path: Path, n_parts: int = 2):
    """Parts written by one rule and an aggregate written from them by another, each with its sidecar, through the
    pipeline's one writer (retinabench.pipeline.job.write_outputs)."""
    from retinabench.pipeline import Job, write_outputs
    parts = []
    for i in range(n_parts):
        out = tmp_path / f"metrics/frozen/enc/task{i}.parquet"
        job = Job(rule="frozen", input={}, output={"metrics": str(out)}, wildcards={"encoder": "enc", "task": f"task{i}"})
        write_outputs(job, {"metrics": pd.DataFrame({"task": [f"task{i}"], "value": [0.5 + i / 10]})})
        parts.append(str(out))
    agg = Job(rule="collect_metrics", input={"metrics": parts}, output={"metrics": str(tmp_path / "metrics.parquet")})
    write_outputs(agg, {"metrics": pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)})
    return parts, str(tmp_path / "metrics.parquet")


def table_entry(name: str = "own", **table) -> dict:
    return {"name": name, "adapter": "table", "root": name, "index_files": [], "modalities": ["cfp"],
            "web_exposure_risk": "low",
            "table": {"modality": "cfp", "patient": {"per_image": True}, **table}}


def table_job(make_manifest_job, root: Path, results: Path, entry: dict):
    return make_manifest_job(root, results, entry, dataset=entry["name"])


# --- fault 1: a changed intermediate is used silently ---

def test_fault1_a_changed_input_stops_the_job_naming_file_rule_and_rebuild(tmp_path):
    from retinabench.integrity import ArtifactChanged
    from retinabench.pipeline import Job, run_stage
    from retinabench.pipeline.stages import STAGES
    parts, _ = sidecar_job(tmp_path, n_parts=3)
    rewrite_keeping_mtime(Path(parts[1]), permute_rows)  # one row: reversing keeps the bytes
    rewrite_keeping_mtime(Path(parts[2]), lambda p: pd.DataFrame({"task": ["x"], "value": [0.9]}).to_parquet(p))
    ran = []
    STAGES.add("fault1_consumer", lambda job: ran.append(job))
    job = Job(rule="fault1_consumer", input={"metrics": parts}, output={"out": str(tmp_path / "out.parquet")})
    with pytest.raises(ArtifactChanged) as err:
        run_stage("fault1_consumer", job)
    text = str(err.value)
    assert not ran, "the stage ran on a changed input"
    assert parts[2] in text and "CHANGED" in text and "rule frozen (encoder=enc, task=task2)" in text
    assert f"--force {parts[2]}" in text and parts[0] not in text


@pytest.mark.slow
def test_fault1_permuted_features_with_restored_mtime_are_refused_and_flagged(tiny_workflow, tmp_path, run_snakemake):
    """The reported fault: one encoder's feature rows permuted in place, mtime restored; the next run used them
    (715 of 2,256 metric rows changed), provenance showed 0 CHANGED and exited 0."""
    work = tmp_path / "repo"
    shutil.copytree(tiny_workflow, work, symlinks=True)
    features = work / "results/features/vit_tiny_random/phantom.parquet"
    rewrite_keeping_mtime(features, permute_rows)
    # the next run that reads it (forced, as a change elsewhere would) stops before using it
    target = "results/metrics/frozen/vit_tiny_random/phantom_cfp_dr3.parquet"
    run = run_snakemake(work, "--force", target, check=False)
    assert run.returncode != 0
    assert "results/features/vit_tiny_random/phantom.parquet" in run.stderr
    assert "rule features (dataset=phantom, encoder=vit_tiny_random)" in run.stderr
    assert "--force results/features/vit_tiny_random/phantom.parquet" in run.stderr
    # verify names it and exits 1; the provenance chain of a figure built from it flags it and exits 1
    verify = cli(work, "verify", "--configfile", "config/tiny.yaml")
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert "CHANGED  results/features/vit_tiny_random/phantom.parquet" in verify.stdout
    prov = cli(work, "provenance", "results/figures/rank_distribution.png")
    assert prov.returncode == 1
    flagged = [line.strip() for line in prov.stdout.splitlines()
               if line.strip().startswith("results/features/vit_tiny_random/phantom.parquet [CHANGED")]
    assert flagged, prov.stdout
    # rebuilding as the message says makes everything consistent again
    run_snakemake(work, "--force", "results/features/vit_tiny_random/phantom.parquet")
    run_snakemake(work)
    assert cli(work, "verify", "--configfile", "config/tiny.yaml").returncode == 0


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


# --- fault 3: two checkouts on one results folder race ---

def lock_record(pid: int, *, host: str | None = None, checkout: str = "/home/other/retinabench") -> dict:
    """The record another checkout's run writes into <results>/.retinabench.lock (retinabench.plan.run_lock)."""
    from retinabench.atomic import host_name
    return {"host": host or host_name(), "pid": pid, "checkout": checkout, "since": "2025-01-02T03:04:05+00:00",
            "command": "snakemake --profile profiles/local all", "token": "0" * 16, "process_start": None}


@pytest.fixture
def other_process():
    """A live process of this host standing for the other checkout's Snakemake."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_fault3_a_second_run_on_a_locked_results_folder_is_refused_naming_the_holder(tmp_path, other_process,
                                                                                     monkeypatch):
    """The lock lives in the results folder, not in a checkout's .snakemake: a run from another checkout on the same
    results folder is refused, with the holder (host, pid, checkout, since) and how to clear a stale lock."""
    from retinabench.atomic import host_name
    from retinabench.plan.run_lock import LOCK_NAME, RunLock, RunLockError, process_start
    results = tmp_path / "shared_results"
    results.mkdir()
    (results / LOCK_NAME).write_text(json.dumps(lock_record(other_process.pid)))
    checkout = tmp_path / "checkout_b"
    checkout.mkdir()
    monkeypatch.chdir(checkout)  # this checkout's .snakemake knows nothing of the other run
    with pytest.raises(RunLockError) as err:
        RunLock(results).acquire()
    said = str(err.value)
    for part in (str(results), f"pid {other_process.pid}", f"host {host_name()}", "checkout /home/other/retinabench",
                 "since 2025-01-02T03:04:05+00:00", "is running on this host", "snakemake --unlock"):
        assert part in said, said
    assert json.loads((results / LOCK_NAME).read_text())["pid"] == other_process.pid  # the holder's lock is kept

    if process_start(other_process.pid):  # Linux: the holder's pid taken by a later process (another start) is stale
        (results / LOCK_NAME).write_text(json.dumps(dict(lock_record(other_process.pid), process_start="1")))
        with pytest.raises(RunLockError, match=f"stale: pid {other_process.pid}"):
            RunLock(results).acquire()
    other_process.kill()
    other_process.wait()
    with pytest.raises(RunLockError, match=rf"stale: pid {other_process.pid} no longer runs on this host"):
        RunLock(results).acquire()
    (results / LOCK_NAME).write_text(json.dumps(lock_record(4242, host="gpu-node-7")))
    with pytest.raises(RunLockError, match=r"another host \(gpu-node-7\): this host .* cannot tell"):
        RunLock(results).acquire()

    said = []
    assert not RunLock(results).at_parse(["snakemake", "-n"], log=said.append)  # a dry run goes on, told who holds it
    assert "is locked by another run (pid 4242 on host gpu-node-7" in said[0] and "a run would be refused" in said[0]
    assert RunLock(results).at_parse(["snakemake", "--unlock"], log=said.append)  # `snakemake --unlock`
    assert said[1].startswith(f"retinabench: removed the run lock {results / LOCK_NAME} (held by pid 4242")
    lock = RunLock(results)
    holder = lock.acquire(checkout=checkout)
    record = json.loads((results / LOCK_NAME).read_text())
    assert (record["pid"], record["host"], record["checkout"]) == (os.getpid(), host_name(), str(checkout))
    with pytest.raises(RunLockError, match=f"pid {os.getpid()}"):  # one writer, even from this same process
        RunLock(results).acquire()
    assert not RunLock(results).release()  # only the lock's own taker releases it
    assert lock.release() and not (results / LOCK_NAME).exists() and holder.token == record["token"]


TAKE_LOCK = textwrap.dedent("""
    import os, sys
    from retinabench.plan.run_lock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    if sys.argv[2] == "killed":
        sys.stdin.readline()  # held until SIGKILL
    raise SystemExit(1)  # an error the Snakefile's handlers never see: released at exit
""")


def test_fault3_the_lock_is_released_at_exit_and_a_killed_runs_lock_is_named_stale(tmp_path):
    from retinabench.plan.run_lock import LOCK_NAME, RunLock, RunLockError
    results = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    exited = subprocess.run([sys.executable, "-c", TAKE_LOCK, str(results), "exits"], capture_output=True, text=True,
                            env=env)
    assert exited.stdout == "locked\n" and not (results / LOCK_NAME).exists(), exited.stderr
    killed = subprocess.Popen([sys.executable, "-c", TAKE_LOCK, str(results), "killed"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    assert killed.stdout.readline() == "locked\n"
    killed.kill()
    killed.wait()
    with pytest.raises(RunLockError, match=rf"stale: pid {killed.pid} no longer runs on this host"):
        RunLock(results).acquire()


@pytest.mark.slow
def test_fault3_snakemake_refuses_a_run_on_a_results_folder_locked_from_another_checkout(tmp_path, other_process):
    """Through Snakemake: the run stops in onstart before any job (nothing written); `snakemake --unlock` clears the
    lock (the lock taken and released by a run: tests/workflow/test_pipeline.py, on the shared tiny run)."""
    from tests.workflow.conftest import TINY, copy_workflow, snakemake
    from retinabench.plan.run_lock import LOCK_NAME
    results = tmp_path / "shared_results"
    work = copy_workflow(tmp_path / "checkout_b", dict(TINY, results=str(results)))
    results.mkdir()
    (results / LOCK_NAME).write_text(json.dumps(lock_record(other_process.pid)))
    run = snakemake(work, "--until", "phantom", check=False)  # a flag first: --configfile takes several files
    said = run.stdout + run.stderr
    assert run.returncode != 0 and "cannot be locked" in said and "checkout /home/other/retinabench" in said, \
        said[-3000:]
    assert sorted(p.name for p in results.iterdir()) == [LOCK_NAME]  # no job ran: nothing written
    snakemake(work, "--unlock")
    assert not (results / LOCK_NAME).exists()


WRITER_B = textwrap.dedent("""
    import sys
    from retinabench.atomic import atomic_path
    with atomic_path(sys.argv[1]) as tmp:
        tmp.write_text("B")
        print(tmp, flush=True)
        sys.stdin.readline()  # wait until writer A has done its part
""")


def test_fault3_two_writers_of_one_destination_keep_their_own_temporary_files(tmp_path):
    """Writer B (another process: another checkout's job) is half-way through writing `t.parquet` when writer A's
    job starts, cleans its leftovers and writes the same file: B's temporary file has another name and survives,
    A's final file is not touched by B, and B's rename completes (old code: both used `t.parquet.tmp`, A's cleanup
    deleted B's file and B's rename failed)."""
    from retinabench.pipeline.job import Job, remove_leftovers, write_artifact
    dest = tmp_path / "results" / "t.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    b = subprocess.Popen([sys.executable, "-c", WRITER_B, str(dest)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        b_tmp = Path(b.stdout.readline().strip())
        assert b_tmp.parent == dest.parent and b_tmp.name.startswith("t.json.") and f".{b.pid}." in b_tmp.name
        job = Job(rule="r", input={}, output={"out": str(dest)})
        left = remove_leftovers(job)  # A's job starts: B's live temporary file is named, not removed
        assert b_tmp.read_text() == "B" and len(left) == 1 and str(b_tmp) in left[0] and f"pid {b.pid}" in left[0]
        write_artifact({"writer": "A"}, dest)
        assert json.loads(dest.read_text()) == {"writer": "A"} and b_tmp.read_text() == "B"
        b.stdin.write("go\n")
        b.stdin.flush()
        assert b.wait(timeout=30) == 0  # B's rename found its file
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    assert dest.read_text() == "B" and sorted(p.name for p in dest.parent.iterdir()) == ["t.json"]


def test_fault3_leftovers_of_killed_writers_are_removed_only_when_their_writer_is_known_gone(tmp_path):
    from retinabench.atomic import host_name, temp_files, temp_path
    from retinabench.pipeline.job import Job, remove_leftovers
    dest = tmp_path / "t.parquet"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = dest.with_name(f"t.parquet.{host_name()}.{dead.pid}.0123abcd.tmp")  # this host, writer gone
    remote = dest.with_name("t.parquet.gpu-node-7.99.0123abcd.tmp")  # another host: cannot tell
    own = temp_path(dest)
    sidecar_tmp = temp_path(tmp_path / "t.parquet.prov.json")
    for p in (killed, remote, own, sidecar_tmp):
        p.write_text("partial")
    assert {t.path for t in temp_files(dest)} == {killed, remote, own}
    left = remove_leftovers(Job(rule="r", input={}, output={"out": str(dest)}))
    assert sorted(p.name for p in tmp_path.iterdir()) == [remote.name]
    assert len(left) == 1 and "pid 99 on gpu-node-7" in left[0]


def test_fault3_phantom_raw_data_and_tiny_models_follow_the_results_folder(tmp_path):
    """The phantom's raw images and the demo's tiny models are planned under a non-default `results:`; the demo
    registry's weights_path names `{results}`, so the interfaces demo starts there (old: `<repo>/results/raw` and a
    refusal naming `results/tiny_models/...`); every shipped demo config has a results folder of its own."""
    from retinabench.plan import WorkflowPlan
    from tests.workflow.conftest import merged
    configs = {n: yaml.safe_load((REPO / f"config/{n}.yaml").read_text())
               for n in ("config", "interfaces_demo", "mllm_demo", "finetune_demo")}
    results = str(tmp_path / "elsewhere")
    config = merged(configs["config"], configs["interfaces_demo"], configs["mllm_demo"], {"results": results})
    config["registries"] = {k: str(REPO / v) for k, v in config["registries"].items()}
    p = WorkflowPlan(config)
    assert p.phantom_metadata == f"{results}/raw/{{generated_root}}/metadata.csv"
    for dataset in ("phantom", "phantom_siteb"):
        assert p.selection.dataset_root(dataset) == f"{results}/raw/{p.reg.dataset(dataset)['root']}"
        assert all(f.startswith(f"{results}/raw/") for f in p.index_files(dataset))
    assert set(p.tiny_models()) == {"tiny_siglip", "tiny_qwen2_vl"}
    for name in p.tiny_models():
        assert p.reg.encoder(name)["weights_path"] == p.tiny_model_folder().format(name=name) == \
            f"{results}/tiny_models/{name}"
    assert p.interfaces.problems() == [] and p.lora.problems() == [] and p.tiny_model_problems() == []
    assert p.run_lock.path == Path(results) / ".retinabench.lock"
    folders = {n: c.get("results", configs["config"]["results"]) for n, c in configs.items()}
    assert len(set(folders.values())) == len(folders), folders  # no demo rebuilds another's phantom


# --- fault 4: images are decoded wrongly or accepted when useless ---
def test_fault4_16bit_grey_png_keeps_its_mean_in_the_image_cache(tmp_path):
    """A 16-bit grey PNG (an OCT export) of mean 12207.5/65535 is 47.5 on the 8-bit scale in the image cache, not
    clipped to near-white."""
    import pandas as pd

    from retinabench.data.image_cache import build_image_cache, open_image_cache
    arr = np.full((64, 64), 48 * 257, np.uint16)
    arr[:32] = 47 * 257
    Image.fromarray(arr).save(tmp_path / "oct16.png")
    assert Image.open(tmp_path / "oct16.png").mode == "I;16"
    manifest = pd.DataFrame({"image_id": ["oct16"], "path": ["oct16.png"]})
    build_image_cache(manifest, tmp_path, tmp_path / "c.npy", tmp_path / "c.parquet", size=64, progress=False)
    cache, _ = open_image_cache(tmp_path / "c.npy", tmp_path / "c.parquet")
    assert cache[0].mean() == 47.5


def test_fault4_a_1x1_image_is_excluded_counted_and_printed(tmp_path, registries, capfd):
    """A 1x1 image named by the index is no sample: the manifest job excludes it with its reason, counts it in
    its summary and prints it; changing images.min_side takes effect without re-decoding."""
    from retinabench.settings import ImagesSettings
    from retinabench.testing.raw_fixtures import write_fixture
    entry = registries.datasets["aptos2019"]
    root = write_fixture("aptos2019", tmp_path / "raw", registries.datasets)
    Image.new("RGB", (1, 1), (90, 40, 20)).save(root / "train_images" / "000c1434d8d7.png")
    Image.new("RGB", (40, 48), (90, 40, 20)).save(root / "train_images" / "001639a390f0.png")
    d = tmp_path / "results" / "data" / "aptos2019"

    def job(images):
        return Job(rule="manifest", input={"index": [str(root / f) for f in entry["index_files"]]},
                   output={k: str(d / f"{k}.parquet") for k in ("manifest", "exclusions", "raw_files")}
                   | {"hashes": str(d / "image_hashes.parquet")},
                   params={"dataset": entry, "root": str(root), "images": images},
                   wildcards={"dataset": "aptos2019"}, threads=1)

    first = job(ImagesSettings().plain())
    run_stage("manifest", first)
    manifest = read_table(first.output["manifest"], "manifest")
    excl = read_table(first.output["exclusions"], "exclusions")
    assert "train_images/000c1434d8d7.png" not in set(manifest["path"]) and len(manifest) == 4
    small = excl[excl["reason"].str.startswith("too_small")]
    assert list(small["source"]) == ["train_images/000c1434d8d7.png"] and list(small["scope"]) == ["image"]
    assert list(small["reason"]) == ["too_small (1x1 < 32 px short side)"]
    summary = read_sidecar(first.output["manifest"])["extra"]["summary"]
    assert summary["too_small"] == {"min_side": 32, "excluded": 1}
    out, _ = capfd.readouterr()
    assert "1 image(s) under 32 px on the short side excluded" in out and "too_small (1x1 < 32 px" in out
    # a larger minimum: the 40x48 image goes too, from the cached sizes (nothing decoded again)
    second = job(ImagesSettings(min_side=48).plain())
    run_stage("manifest", second)
    summary = read_sidecar(second.output["manifest"])["extra"]["summary"]
    assert summary["too_small"] == {"min_side": 48, "excluded": 2} and summary["decode"]["decoded"] == 0
    excl = read_table(second.output["exclusions"], "exclusions")
    assert "too_small (40x48 < 48 px short side)" in set(excl["reason"])
    assert len(read_table(second.output["manifest"], "manifest")) == 3


# --- fault 5: the HTML report can be scripted by data ---
# The end-to-end test (the workflow's own report, built from a task registry whose description is a script, opened
# in headless Chromium): tests/workflow/test_report.py::test_fault5_registry_text_cannot_script_the_report.
SCRIPT = "</script><script>document.title='pwned'</script>"
TASK = {"dataset": "phantom", "label": "dr3", "classes": ["none", "npdr", "pdr"], "modality": "cfp",
        "ordinal": True}


def _snakemake_report(params: dict) -> str:
    """Snakemake's report template (the one ``snakemake --report`` renders, rendered the way its html reporter does)
    with one result whose job parameters are ``params``, formatted as Snakemake formats them."""
    from jinja2 import Environment, PackageLoader
    from snakemake import logging as smk_logging
    from snakemake.report.html_reporter import data
    from snakemake.report.html_reporter.common import get_resource_as_string
    env = Environment(loader=PackageLoader("snakemake", "report/html_reporter/template"), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters["get_resource_as_string"] = get_resource_as_string
    shown = smk_logging.format_dict(params).replace("\n", r"\n").replace('"', r"\"")  # FileRecord.params
    results = {"results/analysis/baselines.csv": {"name": "baselines.csv", "caption": "<p>Baselines</p>",
                                                   "labels": {"figure": "baselines"}, "mime_type": "text/csv",
                                                   "job_properties": {"rule": "baselines", "params": shown}}}
    return env.get_template("index.html.jinja2").render(
        results=json.dumps(results), categories=json.dumps({"1. Ranking": {"Tables": list(results)}}),
        rulegraph="{}", rules="{}", workflow_desc=json.dumps("<p>retinabench</p>"), runtimes="[]", timeline="[]",
        packages=data.get_packages(), metadata="{}", pygments_css="", custom_stylesheet=None, logo="", now="")


def _inline(html: str, element: str):
    from retinabench.report_build import inline_data_blocks
    start, end = next((s, e) for el, s, e in inline_data_blocks(html) if el == element)
    return html[start:end]


def test_fault5_a_registry_description_cannot_end_the_reports_inline_data(tmp_path):
    from retinabench.registry import load_registry
    from retinabench.report_build import escape_inline_data, unescaped_inline_data
    registry = tmp_path / "tasks.yaml"
    registry.write_text(yaml.safe_dump({"phantom_cfp_dr3": {**TASK, "description": SCRIPT, "note": SCRIPT}}))
    tasks = load_registry(registry, "tasks")  # free text is data: the registry accepts it as it is
    raw = _snakemake_report({"tasks": tasks, "regimes": ["u-u"]})  # what the baselines rule carries
    # the fault: Snakemake's JSON keeps "</script>" as it is, so the results script ends inside a string
    assert "results" in unescaped_inline_data(raw)
    assert raw.index(SCRIPT) < raw.index("var categories")
    safe = escape_inline_data(raw)
    assert unescaped_inline_data(safe) == [] and SCRIPT not in safe and "</script><script>" not in _inline(safe,
                                                                                                             "results")
    # the same JavaScript value: the reader sees the description as it was written
    assert json.loads(_inline(safe, "results")) == json.loads(_inline(raw, "results"))
    assert SCRIPT in json.loads(_inline(safe, "results"))["results/analysis/baselines.csv"]["job_properties"]["params"]
    # nothing else changed: with the escapes undone both are the same text (the template's own HTML included)
    assert _unescaped(safe) == _unescaped(raw)


def _unescaped(html: str) -> str:
    from retinabench.report_build import SCRIPT_ESCAPES
    for ch, escape in SCRIPT_ESCAPES.items():
        html = html.replace(escape, ch)
    return html


@pytest.mark.parametrize("kind, bad", [("tasks", SCRIPT), ("tasks", "dr 3"), ("datasets", "site_"),
                                       ("encoders", "-vit"), ("tasks", "a/b")])
def test_fault5_registry_ids_outside_the_safe_set_are_refused(tmp_path, kind, bad):
    from retinabench.registry import RegistryError, load_registry
    entry = {"tasks": TASK, "datasets": {}, "encoders": {}}[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump({bad: entry}))
    with pytest.raises(RegistryError) as err:
        load_registry(path, kind)
    msg = str(err.value)  # the file, the id and the rule, before the entry itself is looked at
    assert str(path) in msg and repr(bad) in msg and "^[A-Za-z0-9]([A-Za-z0-9_.+-]*[A-Za-z0-9])?$" in msg, msg
    assert "is not a valid id" in msg and "rename it" in msg


def test_fault5_prompt_set_and_variant_ids_are_refused_and_every_shipped_registry_passes(tmp_path):
    from retinabench.prompts import PromptError, load_prompts
    from retinabench.registry import RegistryError, load_registry
    prompts = yaml.safe_load((REPO / "config/prompts.yaml").read_text())
    prompts["zeroshot"]["<b>set"] = prompts["zeroshot"][prompts["defaults"]["zeroshot"]]
    (tmp_path / "prompts.yaml").write_text(yaml.safe_dump(prompts))
    with pytest.raises(PromptError, match=r"key zeroshot: '<b>set' is not a valid id"):
        load_prompts(tmp_path / "prompts.yaml")
    encoders = yaml.safe_load((REPO / "config/demo/encoders.yaml").read_text())
    name = next(iter(encoders))
    encoders[name]["variants"] = {"cls pooled": {"pooling": "cls"}}
    (tmp_path / "encoders.yaml").write_text(yaml.safe_dump(encoders))
    with pytest.raises(RegistryError, match=rf"entry '{name}', key variants: 'cls pooled' is not a valid id"):
        load_registry(tmp_path / "encoders.yaml", "encoders")
    shipped = {"datasets": ["config/datasets.yaml", "config/scale/datasets.yaml"],
               "tasks": ["config/tasks.yaml", "config/scale/tasks.yaml"],
               "encoders": ["config/encoders.yaml", "config/demo/encoders.yaml", "config/scale/encoders.yaml"]}
    assert sorted(str(p.relative_to(REPO)) for p in (REPO / "config").rglob("*.yaml")
                  if p.stem in shipped) == sorted(f for files in shipped.values() for f in files)
    for kind, files in shipped.items():
        for f in files:
            assert load_registry(REPO / f, kind), f
    assert load_prompts(REPO / "config/prompts.yaml")


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
    docs = (REPO / "docs" / "datasets.md").read_text()
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


# --- fault 8: missing inputs go unmentioned ---

def test_fault8_a_missing_raw_folder_is_named_at_start(tmp_path, capsys):
    from retinabench.plan import WorkflowPlan
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.update(yaml.safe_load((REPO / "config/tvhl.yaml").read_text()))
    config.update(data_root=str(tmp_path / "data"), results=str(tmp_path / "results"))
    manifest = tmp_path / "results/data/tvhl/manifest.parquet"
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(b"")  # built earlier; the raw folder has gone since
    plan = WorkflowPlan(config)
    notes = plan.missing_raw_folders()
    assert len(notes) == 1 and "raw folder of dataset tvhl is missing" in notes[0]
    assert str(tmp_path / "data" / "tvhl") in notes[0] and "nothing depending on it is rerun" in notes[0]
    manifest.unlink()  # never built: Snakemake itself reports the missing index files
    assert plan.missing_raw_folders() == []


def test_fault8_cli_output_survives_a_closed_pipe(tmp_path):
    parts, agg = sidecar_job(tmp_path)
    # `provenance --json | head -1`: the reader leaves after one line
    proc = subprocess.Popen(f"{sys.executable} -m retinabench provenance --json {agg} | head -1", shell=True,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert out.strip() == "{" and "Traceback" not in err and "BrokenPipeError" not in err, err


# --- fault 9: a failed run leaves a results table that looks current ---

def test_fault9_an_aggregate_whose_inputs_changed_or_vanished_is_flagged_stale(tmp_path):
    from retinabench.integrity import report_stale, results_findings, stale_targets
    from retinabench.pipeline import Job, write_outputs
    parts, agg = sidecar_job(tmp_path, n_parts=3)
    findings, n = results_findings(tmp_path)
    assert findings == [] and n == 4
    # the next run rebuilt one part (new content, new sidecar) and failed on another (Snakemake deleted it)
    rebuilt = Job(rule="frozen", input={}, output={"metrics": parts[0]}, wildcards={"encoder": "enc", "task": "task0"})
    write_outputs(rebuilt, {"metrics": pd.DataFrame({"task": ["task0"], "value": [0.99]})})
    Path(parts[2]).unlink()
    Path(parts[2] + ".prov.json").unlink()
    stale = stale_targets([agg])
    assert [f.status for f in stale] == ["STALE", "STALE"]
    assert f"input {parts[0]} changed since rule collect_metrics used it" in stale[0].detail
    assert f"input {parts[2]} is gone" in stale[1].detail
    findings, _ = results_findings(tmp_path)
    assert {(f.status, f.path) for f in findings} == {("STALE", agg)}
    import io
    buf = io.StringIO()
    report_stale([agg], file=buf)
    assert "this run failed; 2 result(s) left from an earlier run no longer match their inputs" in buf.getvalue()


def test_fault9_verify_exits_1_on_a_stale_table_and_0_when_consistent(tmp_path):
    parts, agg = sidecar_job(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"results": str(tmp_path)}))
    ok = cli(REPO, "verify", "--configfile", str(config))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    Path(parts[1]).unlink()
    bad = cli(REPO, "verify", "--configfile", str(config))
    assert bad.returncode == 1 and f"STALE    {agg}" in bad.stdout and "1 STALE" in bad.stdout, bad.stdout
