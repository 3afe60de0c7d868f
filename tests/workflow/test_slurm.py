"""Slurm dispatch through snakemake-executor-plugin-slurm, against real Slurm daemons.

Without a cluster: dry runs of `--profile slurm` (the link at the repository root) and `profiles/slurm-gh200` show
which partition, GPUs and CPUs every job would ask for, for the workflow and for a toy with other GPU rules.

With one: ci/slurm/up.sh starts munged, slurmctld and slurmd (Debian 12 packages, installed by .ci/run) as
background processes with all state in a temp dir: one node in partitions `cpu` and `gpu` with fake `h100` GPUs.
Representative targets of the tiny phantom workflow (feature extraction and fine-tuning on the GPU partition, the
frozen probes on the CPU partition; upstream data prepared locally) run through `--profile slurm` with site settings
pointing at that cluster. slurmctld's own job records show that GPU rules got the gpu partition and a GPU request
and the CPU rule neither; outputs equal a local run's; a features job and a fine-tuning job cancelled mid-run with
scancel are reported and the next run completes them, the fine-tuning job resuming from its checkpoint
(bit-identical to the uninterrupted local run); a job failing once (test-only srun wrapper) is retried; a gpu=2
rule gets two GPUs and runs torchrun across them. Meanwhile, in a second workdir on the same cluster, the LoRA SFT
demo (config/mllm_demo.yaml: tiny random Qwen2-VL on the phantom glaucoma task, 6 steps, `lora.gpus: 2`,
`lora.processes: 2`) runs its training job as one 2-GPU job on the gpu partition (2 CPUs per GPU from the rule's
4 threads) that launches a torchrun group of 2 CPU (gloo) processes: the adapter folder, its sidecar (every file's
sha256) and compute.json (world size 2, the configured effective batch batch x grad_accum kept by splitting the
accumulation over the processes) appear; then the adapter's inference job asks for 1 GPU and predicts with that
adapter in- and out-of-domain. ci/slurm/down.sh stops every daemon by its own pid, also when a test fails, and no
job process may outlive the cluster. To keep it short, the main Snakemake process polls Slurm every 2 s (FAST_POLL)
instead of the plugin's growing interval.

Without the Slurm binaries or root the cluster tests skip with the reason, except under CI, where they fail; skip
them with `-m "not slurm"`. About 4.5 minutes on a 2-core machine with other work running (4 min 16 s before the
LoRA jobs were added, 4 min 24 s with them; they overlap the other phases).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hashlib
import json

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SNAKEMAKE = str(VENV_BIN / "snakemake")
SLURM_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel",
                  "sinfo")
ENCODER, TASK = "efficientnet_lite0_in1k", "phantom_cfp_dr3"
# The tiny phantom config, plus a small fine-tuning run (one regime, checkpoints every epoch, no LR sweep). Targets:
# one (encoder, task) through phantom, manifest, image cache, split, features (GPU), frozen; and its fine-tuning (GPU).
TINY = {
    "phantom": {"n_patients": 60, "seed": 0, "image_size": 256},
    "encoders": [ENCODER],
    "seeds": [0],
    "linear": {"epochs": 4, "steps_per_epoch": 5, "batch_size": 64, "lr": 0.001, "weight_decay": 0.0001,
               "warmup_frac": 0.1},
    "finetune": {"enabled": True, "protocols": ["finetune"], "tasks": [TASK], "regimes": ["u-u"], "epochs": 4,
                 "steps_per_epoch": 4, "batch_size": 16, "checkpoint_every": 1, "threads": 1},
    "sweep": {"enabled": False},
}
TARGET = f"results/metrics/frozen/{ENCODER}/{TASK}.parquet"
FT_TARGET = f"results/metrics/finetune/{ENCODER}/{TASK}/seed0.parquet"
FT_CHECKPOINTS = f"results/checkpoints/finetune/{ENCODER}/{TASK}/seed0"
COMPARED = [f"results/features/{ENCODER}/phantom.parquet", f"results/predictions/frozen/{ENCODER}/{TASK}.parquet",
            f"results/training_logs/frozen/{ENCODER}/{TASK}.parquet", TARGET,
            f"results/predictions/finetune/{ENCODER}/{TASK}/seed0.parquet",
            f"results/training_logs/finetune/{ENCODER}/{TASK}/seed0.parquet", FT_TARGET]
# The site settings a site would write for this cluster (config/site.yaml format); 1 CPU per GPU fits the 2-core node.
CI_SITE = {"account": None, "qos": None, "flavour": "h100",
           "flavours": {"h100": {"arch": None, "cpu_partition": "cpu", "gpu_partition": "gpu", "gpu_model": "h100",
                                 "cpus_per_gpu": 1, "gpu_constraint": "h100", "gpu_extra": None}}}
# Cluster-specific executor settings: no slurmdbd here, so job states come from squeue; short polling for CI.
CI_FLAGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
            "--seconds-between-status-checks", "1", "--latency-wait", "5"]
GPU_RULES = {"features", "finetune"}
CPU_RULES = {"phantom", "manifest", "duplicates", "image_cache", "split", "task_split", "frozen"}
SLURM_RULES = {"features", "frozen", "finetune"}  # what the cluster runs: the targets' upstream runs locally
# LoRA SFT (issue 13): the demo over config/config.yaml, with a 2-GPU training job running 2 torchrun processes on CPU
# and 6 optimizer steps. grad_accum 2 over 2 processes: 1 per process, the effective batch stays batch x 2.
LORA_MODEL, LORA_TASK, LORA_OOD_TASK = "tiny_qwen2_vl", "phantom_cfp_glaucoma", "phantom_siteb_cfp_glaucoma"
LORA_OVERRIDES = {"lora": {"gpus": 2, "processes": 2, "train": {"max_steps": 6, "grad_accum": 2}}}
LORA_CONFIGS = ("config/mllm_demo.yaml", "config/lora_slurm.yaml")
LORA_R = yaml.safe_load((REPO / LORA_CONFIGS[0]).read_text())["results"]  # the demo's own results folder
LORA_DIR = f"{LORA_R}/lora/{LORA_MODEL}/{LORA_TASK}"
LORA_TARGET = f"{LORA_R}/metrics/mllm_lora/{LORA_MODEL}/{LORA_TASK}.parquet"  # needs the training job's adapter
LORA_PREDICTIONS = f"{LORA_R}/predictions/mllm_lora/{LORA_MODEL}/{LORA_TASK}.parquet"
LORA_RULES = {"mllm_lora_train", "mllm_lora_infer"}  # what the cluster runs of it: data and tiny model run locally


def workflow_copy(dest: Path) -> Path:
    """Snakefile, workflow/, config/, profiles/ and the root `slurm` link, plus the tiny config."""
    dest.mkdir(parents=True)
    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    shutil.copy(REPO / "slurm", dest / "slurm", follow_symlinks=False)
    (dest / "config" / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return dest


def snakemake(workdir: Path, *args: str, timeout: float = 300,
              configs: tuple[str, ...] = ("config/tiny.yaml",)) -> subprocess.CompletedProcess:
    """Run snakemake locally (targets first: --configfile takes several values); return the finished process."""
    cmd = [SNAKEMAKE, *args, "--configfile", *configs]
    return subprocess.run(cmd, cwd=workdir, env=base_env(), capture_output=True, text=True, timeout=timeout)


def lora_workflow_copy(dest: Path) -> Path:
    """The workflow with the LoRA demo config and this test's overrides (config/lora_slurm.yaml)."""
    workflow_copy(dest)
    (dest / LORA_CONFIGS[1]).write_text(yaml.safe_dump(LORA_OVERRIDES))
    return dest


def lora_train_settings() -> dict:
    """lora.train as the LoRA run merges it: the demo's, then this test's overrides."""
    demo = yaml.safe_load((REPO / LORA_CONFIGS[0]).read_text())["lora"]["train"]
    return {**demo, **LORA_OVERRIDES["lora"]["train"]}


def base_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RETINABENCH_SITE", "RETINABENCH_SLURM_FLAVOUR")}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    return env


def job_resources(dry_run_output: str) -> list[tuple[str, dict]]:
    """(rule, resources) for every job printed by `snakemake -n`."""
    jobs, rule = [], None
    for line in dry_run_output.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule = m.group(1)
        elif line.strip().startswith("resources:") and rule:
            items = line.split("resources:", 1)[1].split(", ")
            jobs.append((rule, dict(item.strip().split("=", 1) for item in items)))
            rule = None
    return jobs


# ---------------------------------------------------------------------------------------------------------------
# Routing (no cluster needed): what each job would ask Slurm for
# ---------------------------------------------------------------------------------------------------------------

def test_profile_slurm_routes_gpu_rules_to_the_gpu_partition(tmp_path):
    work = workflow_copy(tmp_path / "repo")
    proc = snakemake(work, "all", "-n", "--profile", "slurm")  # the `slurm` link at the repository root
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = job_resources(proc.stdout)
    assert {r for r, _ in jobs} >= GPU_RULES | CPU_RULES
    assert any("slurm_partition" in res for _, res in jobs), \
        "no job has a Slurm partition: the Snakefile must call apply_site_resources() after its last rule"
    for rule, res in jobs:  # config/site.yaml: h100 flavour
        if int(res.get("gpu", 0)) > 0:  # feature extraction today, fine-tuning and MLLM rules later
            assert (res.get("slurm_partition"), res.get("gpu_model")) == ("gpu", "h100"), (rule, res)
            assert int(res["cpus_per_gpu"]) >= 8, (rule, res)
        else:
            assert res.get("slurm_partition") == "cpu" and "gpu_model" not in res, (rule, res)
    assert {rule for rule, res in jobs if int(res.get("gpu", 0)) > 0} >= GPU_RULES

    proc = snakemake(work, TARGET, "-n", "--profile", "profiles/slurm-gh200")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "this Python is" in proc.stderr or os.uname().machine == "aarch64"  # architecture warning
    jobs = job_resources(proc.stdout)
    [features] = [res for rule, res in jobs if rule == "features"]
    assert (features["slurm_partition"], features["gpu_model"], features["cpus_per_gpu"]) == ("gh200", "gh200", "72")
    assert {res["slurm_partition"] for rule, res in jobs if rule != "features"} == {"gh200"}


MULTI_GPU_SNAKEFILE = """
include: "{resources_smk}"

rule all:
    input: "multi.txt", "maybe_0.txt", "maybe_1.txt", "cpu.txt"

rule multi_gpu:  # a 4-GPU MLLM training job would look the same with gpu=4
    output: "multi.txt"
    threads: 1
    resources: gpu=2, mem_mb=500, runtime=5
    shell: "torchrun --standalone --nnodes=1 --nproc-per-node={{resources.gpu}} probe.py > {{output}}"

rule maybe_gpu:  # the GPU count may depend on the job
    output: "maybe_{{n}}.txt"
    resources: gpu=lambda wc: int(wc.n), mem_mb=500, runtime=5
    shell: "echo $CUDA_VISIBLE_DEVICES > {{output}}"

rule cpu_only:
    output: "cpu.txt"
    resources: mem_mb=500, runtime=5
    shell: "echo cpu > {{output}}"

apply_site_resources()
"""
PROBE = """
import os
print("rank", os.environ["LOCAL_RANK"], "world", os.environ["WORLD_SIZE"],
      "devices", os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), flush=True)
"""


def multi_gpu_workflow(dest: Path, site: dict) -> Path:
    dest.mkdir(parents=True)
    (dest / "Snakefile").write_text(MULTI_GPU_SNAKEFILE.format(resources_smk=REPO / "workflow/rules/resources.smk"))
    (dest / "probe.py").write_text(PROBE)
    (dest / "site.yaml").write_text(yaml.safe_dump(site))
    return dest


def test_any_rule_declaring_gpus_is_routed(tmp_path):
    work = multi_gpu_workflow(tmp_path / "toy", CI_SITE)
    env = dict(base_env(), RETINABENCH_SITE=str(work / "site.yaml"))
    proc = subprocess.run([SNAKEMAKE, "-n", "--profile", str(REPO / "profiles/slurm")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = {(rule, res.get("gpu")): res for rule, res in job_resources(proc.stdout)}
    multi = jobs["multi_gpu", "2"]
    assert (multi["slurm_partition"], multi["gpu_model"], multi["cpus_per_gpu"], multi["constraint"]) == \
        ("gpu", "h100", "1", "h100")
    assert jobs["maybe_gpu", "1"]["slurm_partition"] == "gpu"
    assert jobs["maybe_gpu", "0"]["slurm_partition"] == "cpu" and "gpu_model" not in jobs["maybe_gpu", "0"]
    assert jobs["cpu_only", None]["slurm_partition"] == "cpu"


# ---------------------------------------------------------------------------------------------------------------
# The real cluster
# ---------------------------------------------------------------------------------------------------------------

def require_slurm() -> None:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [b for b in SLURM_BINARIES if shutil.which(b, path=path) is None]
    problem = None
    if missing:
        problem = (f"Slurm binaries missing ({', '.join(missing)}): apt-get install slurmctld slurmd slurm-client "
                   "munge (.ci/run does)")
    elif os.geteuid() != 0:
        problem = "the test cluster needs root (slurmd runs jobs as their users)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must run the Slurm tests")
        pytest.skip(problem)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    base: Path
    env: dict

    def run(self, *cmd: str) -> str:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=True, timeout=30).stdout

    def jobs(self) -> list[dict]:
        """slurmctld's record of every job (MinJobAge keeps finished ones): one dict of scontrol fields per job."""
        out = self.run("scontrol", "-o", "show", "job")
        jobs = []
        for line in out.splitlines():
            if not line.startswith("JobId="):  # "No jobs in the system"
                continue
            fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            m = re.match(r"rule_(\w+?)(?:_wildcards_|$)", fields.get("Comment", ""))
            jobs.append({**fields, "rule": m.group(1) if m else None})
        return sorted(jobs, key=lambda j: int(j["JobId"]))

    def daemon_pids(self) -> dict[str, int]:
        pids = {}
        for name in ("munged", "slurmctld", "slurmd"):
            f = self.base / "run" / f"{name}.pid"
            if f.is_file() and f.read_text().strip():
                pids[name] = int(f.read_text())
        return pids


def stray_processes(root: Path) -> dict[int, str]:
    """Processes (not this one or its ancestors) whose command line names a path under `root`: Slurm jobs of these
    tests. Ancestors are left out because `pytest --basetemp=ROOT` (and a `timeout` around it) names `root` too."""
    found, mine, pid = {}, {os.getpid()}, os.getpid()
    while pid > 1:  # walk the parent chain
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        mine.add(pid)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline:
            found[int(entry.name)] = cmdline[:200]
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_slurm()
    base = tmp_path_factory.mktemp("slurm")
    # 8 CPUs on a 2-core machine and 6 GPUs: independent jobs overlap (most of a job's time is Snakemake starting),
    # the LoRA training job's 2 GPUs x 2 CPUs included.
    env = dict(base_env(), SLURMCTLD_PORT=str(free_port()), SLURMD_PORT=str(free_port()), SLURM_NODE_CPUS="8",
               SLURM_FAKE_GPUS="6")
    env["PATH"] += ":/usr/sbin:/sbin"
    started = None
    try:
        up = subprocess.run(["bash", str(REPO / "ci/slurm/up.sh"), str(base)], env=env, capture_output=True,
                            text=True, timeout=120)
        started = Cluster(base, env)
        assert up.returncode == 0, f"ci/slurm/up.sh failed:\n{up.stdout}\n{up.stderr}"
        assert set(started.daemon_pids()) == {"munged", "slurmctld", "slurmd"}, up.stdout
        cluster_env = dict(env, SLURM_CONF=str(base / "etc/slurm.conf"), PATH=f"{base / 'bin'}:{env['PATH']}")
        yield Cluster(base, cluster_env)
    finally:
        pids = started.daemon_pids() if started else {}
        down = subprocess.run(["bash", str(REPO / "ci/slurm/down.sh"), str(base)], env=env, capture_output=True,
                              text=True, timeout=120)
        still = {name: pid for name, pid in pids.items() if alive(pid)}
        assert down.returncode == 0 and not still, f"daemons left running {still}:\n{down.stdout}\n{down.stderr}"
        strays = stray_processes(tmp_path_factory.getbasetemp())
        for pid in strays:  # job processes that escaped Slurm's process tracking
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not strays, f"processes of this module's jobs outlived the cluster (killed now): {strays}"


@dataclass
class SlurmRuns:
    work: Path
    local: Path
    cancelled: subprocess.CompletedProcess
    cancelled_ids: dict[str, str]
    completed: subprocess.CompletedProcess
    multi_gpu: Path
    multi_gpu_run: subprocess.CompletedProcess
    lora: Path
    lora_run: subprocess.CompletedProcess
    jobs: list[dict]


FAST_POLL = """# Test-only (tests/workflow/test_slurm.py): cap the Slurm executor's status polling interval at 2 s.
# snakemake-executor-plugin-slurm adds 10 s to it after every poll in which no job finished (kind to a busy
# slurmctld), which on a 2-core CI machine would double the test's duration. Submission, status parsing,
# cancellation and retries are untouched. Only the main `snakemake` process (jobs run `python -m snakemake`).
import os
import sys

if sys.argv and os.path.basename(sys.argv[0]) == "snakemake":
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    _interval = RemoteExecutor.next_seconds_between_status_checks
    RemoteExecutor.next_seconds_between_status_checks = _interval.setter(
        lambda self, seconds: _interval.fset(self, None if seconds is None else min(seconds, 2)))
"""
FAIL_ONCE_SRUN = """#!/bin/sh
# Test-only: the first job of a rule named by a file in {flags} fails once (a transient node failure), before
# its Snakemake step starts. The plugin's jobstep calls `srun ... --allowed-rules <rule> ...` inside each job.
for flag in {flags}/*; do
  [ -e "$flag" ] || continue
  case " $* " in
    *" --allowed-rules $(basename "$flag") "*) rm "$flag" 2>/dev/null && echo "test: injected failure" >&2 && exit 1;;
  esac
done
exec {srun} "$@"
"""


@pytest.fixture(scope="module")
def slurm_runs(cluster, tmp_path_factory) -> SlurmRuns:
    """The targets' upstream (phantom, manifest, duplicates, image cache, splits) runs locally and is copied to the
    Slurm workdir; then 1) `snakemake TARGET FT_TARGET --profile slurm --retries 0`, its features job cancelled with
    scancel once the features stage runs and its fine-tuning job once it has written a checkpoint (meanwhile the
    local copy finishes the targets, for comparison); 2) the same command with the profile's retries while the first
    frozen job fails once: completes everything (meanwhile a 2-GPU toy job runs). Upstream rules run locally only to
    keep the test short: every rule's routing is checked by the dry runs above, and each Slurm job costs two
    Snakemake start-ups plus status polling. The LoRA demo has its own workdir (another config: its data and tiny
    model are prepared locally alongside the targets' upstream); `snakemake LORA_TARGET --profile slurm --retries 0`
    runs its training and inference jobs on the cluster during 1) and 2)."""
    tmp = tmp_path_factory.mktemp("slurmrun")
    local = workflow_copy(tmp / "local")
    lora = lora_workflow_copy(tmp / "lora")
    work = tmp / "repo"
    (tmp / "site.yaml").write_text(yaml.safe_dump(CI_SITE))
    flags, inject = tmp / "fail-once", tmp / "inject"
    flags.mkdir()
    inject.mkdir()
    (inject / "srun").write_text(FAIL_ONCE_SRUN.format(flags=flags, srun=cluster.base / "bin/srun"))
    (inject / "srun").chmod(0o755)
    (inject / "sitecustomize.py").write_text(FAST_POLL)
    env = dict(cluster.env, RETINABENCH_SITE=str(tmp / "site.yaml"), PATH=f"{inject}:{cluster.env['PATH']}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(inject), cluster.env.get("PYTHONPATH")])))
    cmd = [SNAKEMAKE, TARGET, FT_TARGET, "--profile", "slurm", *CI_FLAGS, "--configfile", "config/tiny.yaml"]
    lora_cmd = [SNAKEMAKE, LORA_TARGET, "--profile", "slurm", *CI_FLAGS, "--retries", "0",
                "--configfile", *LORA_CONFIGS]

    logs = {name: open(tmp / f"{name}.log", "w+") for name in ("lora_upstream", "cancelled", "local", "lora")}
    procs = {}
    cancelled_ids = {}
    try:
        procs["lora_upstream"] = subprocess.Popen(
            [SNAKEMAKE, LORA_TARGET, "--until", "task_split", "image_cache", "tiny_model", "--profile",
             "profiles/local", "--cores", "2", "--configfile", *LORA_CONFIGS], cwd=lora, env=base_env(),
            stdout=logs["lora_upstream"], stderr=subprocess.STDOUT, text=True)
        upstream = snakemake(local, TARGET, FT_TARGET, "--until", "task_split", "image_cache", "--profile",
                             "profiles/local", "--cores", "2")
        assert upstream.returncode == 0, upstream.stderr[-6000:]
        shutil.copytree(local, work, symlinks=True)  # with .snakemake/ metadata and modification times
        procs["lora_upstream"].wait(timeout=240)
        lora_upstream = finished(procs["lora_upstream"], logs["lora_upstream"])
        assert lora_upstream.returncode == 0, lora_upstream.stdout[-6000:]

        procs["local"] = subprocess.Popen([SNAKEMAKE, TARGET, FT_TARGET, "--profile", "profiles/local", "--cores",
                                           "2", "--configfile", "config/tiny.yaml"], cwd=local, env=base_env(),
                                          stdout=logs["local"], stderr=subprocess.STDOUT, text=True)
        procs["cancelled"] = subprocess.Popen([*cmd, "--retries", "0"], cwd=work, env=env, stdout=logs["cancelled"],
                                              stderr=subprocess.STDOUT, text=True)
        procs["lora"] = subprocess.Popen(lora_cmd, cwd=lora, env=env, stdout=logs["lora"],
                                         stderr=subprocess.STDOUT, text=True)
        # Cancel features once its stage runs, fine-tuning once it has written its first checkpoint.
        ready = {"features": lambda: (work / f"results/logs/features/{ENCODER}/phantom.log").is_file(),
                 "finetune": lambda: any((work / FT_CHECKPOINTS).rglob("epoch*.pt.sha256"))}
        deadline = time.monotonic() + 240
        while procs["cancelled"].poll() is None and time.monotonic() < deadline and len(cancelled_ids) < 2:
            for job in cluster.jobs():
                rule = job["rule"]
                if rule in ready and rule not in cancelled_ids and job.get("JobState") == "RUNNING" and ready[rule]():
                    cluster.run("scancel", job["JobId"])
                    cancelled_ids[rule] = job["JobId"]
            time.sleep(0.5)
        procs["cancelled"].wait(timeout=180)
        cancelled = finished(procs["cancelled"], logs["cancelled"])
        assert set(cancelled_ids) == set(ready), f"cancelled only {cancelled_ids}:\n{cancelled.stdout[-6000:]}"
        results = run_b_with_multi_gpu_toy(tmp, work, env, cmd, flags)  # the local and LoRA runs may still go on
        procs["lora"].wait(timeout=240)
        lora_run = finished(procs["lora"], logs["lora"])
        procs["local"].wait(timeout=240)
        local_run = finished(procs["local"], logs["local"])
        assert local_run.returncode == 0, local_run.stdout[-6000:]
    finally:
        for proc in procs.values():  # only after a failure above: our own children, by their pid
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    jobs = cluster.jobs()
    for j in jobs:  # shown with the output of a failing test
        print(j["JobId"], j["rule"], j["Partition"], j["JobState"], *(j.get(k, "").split("T")[-1] for k in
              ("SubmitTime", "StartTime", "EndTime")), j.get("TresPerJob", ""), j.get("NumCPUs", ""))
    return SlurmRuns(work, local, cancelled, cancelled_ids, *results, lora, lora_run, jobs)


def finished(proc: subprocess.Popen, log) -> subprocess.CompletedProcess:
    log.seek(0)
    out = log.read()
    log.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def run_b_with_multi_gpu_toy(tmp, work, env, cmd, flags):
    """The rerun (with the profile's retries; the first frozen job fails once) and, alongside, a 2-GPU toy job."""
    (flags / "frozen").touch()
    toy = multi_gpu_workflow(tmp / "toy", CI_SITE)
    toy_cmd = [SNAKEMAKE, "multi.txt", "--profile", str(REPO / "profiles/slurm"), *CI_FLAGS]
    toy_log = open(tmp / "toy.log", "w+")
    toy_proc = subprocess.Popen(toy_cmd, cwd=toy, env=dict(env, RETINABENCH_SITE=str(toy / "site.yaml")),
                                stdout=toy_log, stderr=subprocess.STDOUT, text=True)
    try:
        completed = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        toy_proc.wait(timeout=120)
    finally:
        if toy_proc.poll() is None:  # only after a failure above
            toy_proc.kill()
            toy_proc.wait()
    return completed, toy, finished(toy_proc, toy_log)


@pytest.mark.slow
@pytest.mark.slurm
def test_gpu_rules_run_on_gpu_partition_with_gpus_cpu_rules_do_not(slurm_runs):
    jobs = [j for j in slurm_runs.jobs if j["rule"] in GPU_RULES | CPU_RULES]
    assert {j["rule"] for j in jobs} == SLURM_RULES, slurm_runs.jobs
    for job in jobs:
        gres = job.get("TresPerJob", "") + job.get("TresPerNode", "")
        if job["rule"] in GPU_RULES:
            assert job["Partition"] == "gpu" and "gres:gpu:h100:1" in gres, job
            assert job["Features"] == "h100" and job.get("CpusPerTres", "").startswith("gres:gpu:"), job
        else:
            assert job["Partition"] == "cpu" and "gpu" not in gres and "CpusPerTres" not in job, job


@pytest.mark.slow
@pytest.mark.slurm
def test_outputs_equal_a_local_run(slurm_runs):
    """Also for the fine-tuning job that was cancelled and resumed: bit-identical to an uninterrupted run."""
    assert slurm_runs.completed.returncode == 0, slurm_runs.completed.stderr[-6000:]
    for path in COMPARED:
        pd.testing.assert_frame_equal(pd.read_parquet(slurm_runs.work / path),
                                      pd.read_parquet(slurm_runs.local / path), obj=path)


@pytest.mark.slow
@pytest.mark.slurm
def test_cancelled_jobs_are_reported_and_the_next_run_completes_them(slurm_runs):
    """What `snakemake --profile slurm all` does after a scancel, on the representative targets."""
    out = slurm_runs.cancelled.stdout
    assert slurm_runs.cancelled.returncode != 0, out[-4000:]
    for rule, jobid in slurm_runs.cancelled_ids.items():
        assert f"SLURM-job '{jobid}' failed, SLURM status is: 'CANCELLED'" in out, out[-6000:]
        assert f"Error in rule {rule}" in out
        assert [j["JobState"] for j in slurm_runs.jobs if j["rule"] == rule] == ["CANCELLED", "COMPLETED"], rule
    assert slurm_runs.completed.returncode == 0, slurm_runs.completed.stderr[-6000:]
    done = subprocess.run([SNAKEMAKE, TARGET, FT_TARGET, "-n", "--profile", "slurm", "--configfile",
                           "config/tiny.yaml"], cwd=slurm_runs.work, env=base_env(), capture_output=True, text=True,
                          timeout=120)
    assert "Nothing to be done" in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.slurm
def test_cancelled_fine_tuning_resumes_from_its_checkpoint(slurm_runs):
    log = (slurm_runs.work / f"results/logs/finetune/finetune/{ENCODER}/{TASK}/seed0.log").read_text()
    assert re.search(r"resumed from \S+ at epoch [1-3] ", log), log
    compute = pd.read_parquet(slurm_runs.work / f"results/compute/finetune/{ENCODER}/{TASK}/seed0.parquet")
    assert (compute["resumed_from_epoch"] >= 1).all(), compute.T
    assert not (slurm_runs.work / FT_CHECKPOINTS).exists()  # removed once the outputs are written


@pytest.mark.slow
@pytest.mark.slurm
def test_job_failing_once_is_retried(slurm_runs):
    frozen = [j for j in slurm_runs.jobs if j["rule"] == "frozen"]
    assert [j["JobState"] for j in frozen] == ["FAILED", "COMPLETED"], frozen
    failed = frozen[0]["JobId"]
    log = slurm_runs.completed.stderr
    assert f"SLURM-job '{failed}' failed, SLURM status is: 'FAILED'" in log and "Trying to restart job" in log, \
        log[-6000:]
    assert "test: injected failure" in Path(frozen[0]["StdOut"]).read_text()
    assert slurm_runs.completed.returncode == 0


@pytest.mark.slow
@pytest.mark.slurm
def test_multi_gpu_job_gets_its_gpus_and_runs_torchrun(slurm_runs):
    proc = slurm_runs.multi_gpu_run
    assert proc.returncode == 0, proc.stdout[-6000:]
    ranks = sorted(line for line in (slurm_runs.multi_gpu / "multi.txt").read_text().splitlines()
                   if line.startswith("rank"))
    # both ranks see the job's two GPUs: which two of the node's 6 depends on the jobs running alongside (LoRA's)
    assert [line.split(" devices ")[0] for line in ranks] == ["rank 0 world 2", "rank 1 world 2"], ranks
    devices = {line.split(" devices ")[1] for line in ranks}
    assert len(devices) == 1 and len({int(d) for d in next(iter(devices)).split(",")} & set(range(6))) == 2, ranks
    [job] = [j for j in slurm_runs.jobs if j["rule"] == "multi_gpu"]
    assert job["Partition"] == "gpu" and "gres:gpu:h100:2" in job.get("TresPerJob", ""), job


def lora_job(slurm_runs, rule: str) -> dict:
    run = slurm_runs.lora_run
    assert run.returncode == 0, run.stdout[-6000:]
    [job] = [j for j in slurm_runs.jobs if j["rule"] == rule]  # --retries 0: one job, no retry hiding a failure
    assert job["JobState"] == "COMPLETED", job
    return job


@pytest.mark.slow
@pytest.mark.slurm
def test_lora_training_job_gets_its_gpus_and_runs_one_process_per_gpu(slurm_runs):
    """Issue 13: the training job asks Slurm for lora.gpus (2) GPUs and runs a torchrun group of lora.processes (2)
    processes (CPU, gloo) inside that job; the adapter, its sidecar and the compute record come back."""
    job = lora_job(slurm_runs, "mllm_lora_train")
    assert {j["rule"] for j in slurm_runs.jobs if j["rule"] and j["rule"].startswith("mllm")} == LORA_RULES
    assert job["Partition"] == "gpu" and "gres:gpu:h100:2" in job.get("TresPerJob", ""), job
    # the rule's 4 threads over its 2 GPUs: 2 CPUs per GPU
    assert (job["Features"], job.get("CpusPerTres"), job["NumCPUs"]) == ("h100", "gres:gpu:2", "4"), job
    log = (slurm_runs.lora / f"{LORA_R}/logs/mllm_lora_train/{LORA_MODEL}/{LORA_TASK}.log").read_text()
    assert "training with 2 process(es) (job holds 2 GPU(s) on Slurm)" in log, log[-4000:]
    assert "torch.distributed.run --standalone --nproc_per_node=2" in log, log[-4000:]
    for rank in (0, 1):
        assert re.search(rf"^\[rank {rank}\] lora {LORA_MODEL}/{LORA_TASK}: \d+ training examples", log, re.M), log

    out = slurm_runs.lora / LORA_DIR
    train = lora_train_settings()
    compute = json.loads((out / "compute.json").read_text())
    assert (compute["world_size"], compute["steps"]) == (2, train["max_steps"]), compute
    assert compute["batch_size"] == train["batch_size"] and compute["grad_accum"] == train["grad_accum"] // 2, compute
    assert compute["effective_batch"] == train["batch_size"] * train["grad_accum"] == 8, compute
    steps = pd.read_parquet(out / "train_log.parquet")["step"].tolist()
    assert steps == list(range(1, train["max_steps"] + 1)), steps

    sidecar = json.loads((out / "adapter.prov.json").read_text())
    adapter = out / "adapter"
    on_disk = {f.relative_to(adapter).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
               for f in sorted(adapter.rglob("*")) if f.is_file() and f.name != ".snakemake_timestamp"}  # Snakemake's
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(on_disk), on_disk
    assert sidecar["files"] == on_disk and sidecar["rule"] == "mllm_lora_train", sidecar.get("files")
    record = sidecar["extra"]["adapter"]
    assert (record["world_size"], record["effective_batch"], record["base"]["name"]) == (2, 8, LORA_MODEL), record
    assert not (out / "checkpoints").exists()  # rank 0 removed them once the adapter was written


@pytest.mark.slow
@pytest.mark.slurm
def test_lora_inference_job_gets_one_gpu_and_uses_the_trained_adapter(slurm_runs):
    train, infer = (lora_job(slurm_runs, rule) for rule in ("mllm_lora_train", "mllm_lora_infer"))
    assert infer["Partition"] == "gpu" and "gres:gpu:h100:1" in infer.get("TresPerJob", ""), infer
    assert infer["StartTime"] >= train["EndTime"], (train, infer)
    sidecar = json.loads((slurm_runs.lora / LORA_DIR / "adapter.prov.json").read_text())
    preds = pd.read_parquet(slurm_runs.lora / LORA_PREDICTIONS)
    assert set(preds["adapter"]) == {sidecar["sha256"]}  # the adapter folder's digest, verified on load
    assert set(preds["train_task"]) == {LORA_TASK} and set(preds["task"]) == {LORA_TASK, LORA_OOD_TASK}
    assert (slurm_runs.lora / LORA_TARGET).is_file()
