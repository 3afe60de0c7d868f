"""Time `snakemake -n` (the DAG build) on the paper-sized grids, CPU and wall, with the job count.

* ``scale``: config/scale.yaml (34 encoders x 39 tasks of synthetic registries; no data needed).
* any other config (``ocularbench``, ``focus``, or ``ocularbench+ocularbench_plus`` for several config files merged in
  order): on a fake data root (``python -m retinabench.testing.raw_fixtures``) with a temporary lock file pinning
  every encoder entry a job loads (dry runs refuse unlocked encoders). Runs in a temporary copy of the workflow so
  the repository's lock file is never touched.

    python bench/dag_scale.py [--configs scale,ocularbench,focus] [--repo DIR] [--profile] [--rules]

``--repo`` times another checkout (e.g. an older commit exported with ``git archive``) with the same procedure;
``--profile`` writes a cProfile of each dry run beside the copy and prints its top entries; ``--rules`` prints the
job count per rule. Goal: each dry run <= 30 s CPU on 2 cores.
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


def fake_lock(work: Path, config_files: list[str], data_root: Path) -> None:
    """A lock file beside the config's encoder registry recording placeholder pins for every encoder entry a job of
    the merged config loads."""
    import yaml
    for module in [m for m in sys.modules if m == "retinabench" or m.startswith("retinabench.")]:
        del sys.modules[module]  # the previous config's copy (deleted): import this copy's package afresh
    sys.path.insert(0, str(work / "src"))
    from snakemake.utils import update_config

    from retinabench.plan import WorkflowPlan
    from retinabench.registry import load_registry
    from retinabench.registry.lockfile import lock_name, needs_lock, pins_of, write_lock
    config = yaml.safe_load((work / "config/config.yaml").read_text())
    for f in config_files:
        update_config(config, yaml.safe_load((work / f).read_text()))
    config["data_root"] = str(data_root)
    config["registries"] = {k: str(work / v) for k, v in config["registries"].items()}
    registry = Path(config["registries"]["encoders"])
    encoders = load_registry(registry, "encoders")
    records = {}
    for name in sorted(WorkflowPlan(config).weight_entries):
        entry = encoders[name]
        if needs_lock(entry):
            records[lock_name(entry)] = {"pins": pins_of(entry), "revision": "0" * 40, "locked_at": "fake",
                                         "files": {f: "0" * 64 for f in pins_of(entry)["files"]}}
    write_lock(registry.with_name(registry.stem + ".lock.yaml"), records)


def dry_run(repo: Path, name: str, profile: bool) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"dag_{name}_"))
    work = tmp / "repo"
    work.mkdir()
    for item in ("Snakefile", "workflow", "config", "profiles", "envs", "src"):
        src = repo / item
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    files = [f"config/{n}.yaml" for n in name.split("+")]
    args = ["--configfile", *files]
    env = dict(os.environ, PYTHONPATH=str(work / "src"))
    if name != "scale":
        subprocess.run([sys.executable, "-m", "retinabench.testing.raw_fixtures", str(tmp / "data")], env=env,
                       check=True, capture_output=True)
        fake_lock(work, files, tmp / "data")
        args += ["--config", f"data_root={tmp / 'data'}"]
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    cmd = [snakemake, "-n", "--quiet", "rules", *args]
    if profile:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(tmp / "dag.prof"), snakemake, "-n", "--quiet", "rules",
               *args]
    t0, r0 = time.perf_counter(), os.times()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    r1, wall = os.times(), time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: snakemake -n failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    m = re.search(r"^total\s+(\d+)", proc.stdout, re.M)
    rules = {r: int(n) for r, n in re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, re.M) if r != "total"}
    out = {"config": name, "jobs": int(m.group(1)) if m else None, "rules": rules, "wall_s": round(wall, 1),
           "cpu_s": round((r1.children_user - r0.children_user) + (r1.children_system - r0.children_system), 1)}
    if profile:
        import pstats
        stats = pstats.Stats(str(tmp / "dag.prof"))
        stats.sort_stats("cumulative").print_stats(40)
        out["profile"] = str(tmp / "dag.prof")
    else:
        shutil.rmtree(tmp)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="scale,ocularbench")
    ap.add_argument("--repo", default=str(REPO), help="checkout to time (default: this one)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rules", action="store_true", help="print the job count per rule")
    args = ap.parse_args()
    for name in args.configs.split(","):
        r = dry_run(Path(args.repo).resolve(), name, args.profile)
        print(f"{r['config']:<12} {r['jobs']} jobs  cpu {r['cpu_s']} s  wall {r['wall_s']} s"
              + (f"  profile {r['profile']}" if "profile" in r else ""), flush=True)
        if args.rules:
            for rule, n in sorted(r["rules"].items()):
                print(f"  {rule:<28} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
