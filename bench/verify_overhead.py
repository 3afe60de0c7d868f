"""What verifying every input against its sidecar costs (issue 23's verify-on-read), measured side by side: the same
workflow run twice from scratch in two fresh copies, once as it runs for users and once with
RETINABENCH_SKIP_INPUT_VERIFICATION=1 (the baseline; each job's log then says its inputs were used unverified).

Also sums what the jobs themselves report (`[done] ... (12.3 s; N input(s) verified in X s)`): the time spent hashing inputs
before a job starts. Each file is hashed once per job (memoised), and the sidecars written afterwards reuse the
digests, so most of that time is moved rather than added. Goal: ratio <= 1.05.

    python bench/verify_overhead.py [--configfile .test/config/config.yaml] [--cores 2]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_VERIFIED = re.compile(r"; (\d+) input\(s\) verified in ([0-9.]+) s\)$")
_DONE = re.compile(r"\((\d+(?:\.\d+)?) s[;)]")


def copy_workflow(dest: Path, configfile: Path) -> Path:
    dest.mkdir(parents=True)
    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    shutil.copy(configfile, dest / "config" / "bench.yaml")
    return dest


def run(work: Path, cores: int, skip: bool) -> float:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    env.pop("RETINABENCH_SKIP_INPUT_VERIFICATION", None)
    if skip:
        env["RETINABENCH_SKIP_INPUT_VERIFICATION"] = "1"
    cmd = [str(Path(sys.executable).with_name("snakemake")), "--profile", "profiles/local", "--cores", str(cores),
           "--configfile", "config/bench.yaml"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run in {work} failed:\n{proc.stderr[-4000:]}")
    return seconds


def job_seconds(work: Path) -> tuple[int, float, float, int]:
    """(jobs, summed job seconds, summed verification seconds, inputs verified) from the jobs' [done] lines."""
    jobs, total, verify, n_inputs = 0, 0.0, 0.0, 0
    for log in (work / "results" / "logs").rglob("*.log"):
        lines = log.read_text(errors="replace").rstrip().splitlines()
        if not lines or not lines[-1].startswith("[done]"):
            continue
        jobs += 1
        done = _DONE.search(lines[-1])
        total += float(done.group(1)) if done else 0.0
        ver = _VERIFIED.search(lines[-1])
        if ver:
            n_inputs += int(ver.group(1))
            verify += float(ver.group(2))
    return jobs, total, verify, n_inputs


def main(configfile: str = ".test/config/config.yaml", cores: int = 2) -> float:
    with tempfile.TemporaryDirectory(prefix="verify_overhead_") as tmp:
        verified = copy_workflow(Path(tmp) / "verified", REPO / configfile)
        baseline = copy_workflow(Path(tmp) / "baseline", REPO / configfile)
        # alternate the order over two rounds would double the time; the baseline runs first so the page cache
        # favours the verified run no more than it favours the baseline (both read the same fresh inputs)
        t_base = run(baseline, cores, skip=True)
        t_ver = run(verified, cores, skip=False)
        jobs, job_total, verify_total, n_inputs = job_seconds(verified)
        b_jobs, b_total, _, _ = job_seconds(baseline)
    print(f"workflow ({configfile}, {cores} cores): {jobs} jobs")
    print(f"  wall, verified run      {t_ver:8.1f} s")
    print(f"  wall, unverified run    {t_base:8.1f} s")
    print(f"  summed job time         {job_total:8.1f} s verified, {b_total:8.1f} s unverified ({b_jobs} jobs)")
    print(f"  verification in jobs    {verify_total:8.2f} s for {n_inputs} inputs (upper bound of the added time)")
    ratio = t_ver / t_base
    print(f"ratio (wall, verified / unverified): {ratio:.3f}  goal <= 1.05")
    print(f"ratio (summed job time, upper bound): {job_total / max(job_total - verify_total, 1e-9):.3f}")
    return ratio


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", default=".test/config/config.yaml")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    main(args.configfile, args.cores)
