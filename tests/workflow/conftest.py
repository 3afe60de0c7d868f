"""A tiny copy of the workflow (.test/config/config.yaml: phantom data, two offline encoders) run once per test
session."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The CI's workflow config (.test/config/config.yaml): phantom data, two offline encoders, two seeds.
TINY = yaml.safe_load((REPO / ".test" / "config" / "config.yaml").read_text())


def copy_workflow(dest: Path, overrides: dict) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    (dest / "config" / "tiny.yaml").write_text(yaml.safe_dump(overrides))
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    cmd = [SNAKEMAKE, "--profile", "profiles/local", "--cores", "2", "--configfile", "config/tiny.yaml", *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory) -> Path:
    """Workdir of a finished tiny run; tests may read it but must copy it before changing anything."""
    workdir = copy_workflow(tmp_path_factory.mktemp("wf") / "repo", TINY)
    run = snakemake(workdir)
    (workdir / "run.log").write_text(run.stdout + run.stderr)  # what the console showed (tests read it)
    return workdir


@pytest.fixture(scope="session")
def run_snakemake():
    """The `snakemake(workdir, *args, check=True)` helper, for tests that run the workflow themselves."""
    return snakemake


@pytest.fixture(scope="session")
def make_workflow_copy():
    """The `copy_workflow(dest, overrides)` helper: a fresh copy of the workflow with config/tiny.yaml."""
    return copy_workflow
