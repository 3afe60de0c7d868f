"""Issue 23 ("Nothing changes a result silently"): each fault reproduced on generated fixtures, with the behaviour
that replaces it asserted."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


# --- fault 3: two checkouts on one results folder race ---

def lock_record(pid: int, *, host: str | None = None, checkout: str = "/home/other/retinabench") -> dict:
    """The record another checkout's run writes into <results>/.retinabench.lock (retinabench.pipeline.run_lock)."""
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
    from retinabench.pipeline.run_lock import LOCK_NAME, RunLock, RunLockError, process_start
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
    from retinabench.pipeline.run_lock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    if sys.argv[2] == "killed":
        sys.stdin.readline()  # held until SIGKILL
    raise SystemExit(1)  # an error the Snakefile's handlers never see: released at exit
""")


def test_fault3_the_lock_is_released_at_exit_and_a_killed_runs_lock_is_named_stale(tmp_path):
    from retinabench.pipeline.run_lock import LOCK_NAME, RunLock, RunLockError
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
    from retinabench.pipeline.run_lock import LOCK_NAME
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
    from retinabench.pipeline.plan import WorkflowPlan
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
    assert set(p.interfaces.tiny_models()) == {"tiny_siglip", "tiny_qwen2_vl"}
    for name in p.interfaces.tiny_models():
        assert p.reg.encoder(name)["weights_path"] == p.interfaces.tiny_model_folder().format(name=name) == \
            f"{results}/tiny_models/{name}"
    assert p.interfaces.problems() == [] and p.lora.problems() == []
    assert p.run_lock.path == Path(results) / ".retinabench.lock"
    folders = {n: c.get("results", configs["config"]["results"]) for n, c in configs.items()}
    assert len(set(folders.values())) == len(folders), folders  # no demo rebuilds another's phantom
