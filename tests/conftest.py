import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RETINABENCH_SHARED", REPO.parent / "shared"))
TVHL = SHARED / "data" / "tvhl"


def require_shared() -> Path:
    """Real-data tests skip with a reason locally, but must not skip silently in CI."""
    if not TVHL.is_dir():
        msg = f"../shared/data/tvhl not found at {TVHL}"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}; CI must run the real-data tests")
        pytest.skip(msg)
    return TVHL


@pytest.fixture(scope="session")
def tvhl_root() -> Path:
    return require_shared()


@pytest.fixture(scope="session")
def tvhl_manifest(tvhl_root):
    from retinabench.data.adapters.tvhl import adapt_tvhl
    return adapt_tvhl(tvhl_root, {"name": "tvhl"})


def shipped_config(*names: str) -> dict:
    """config/config.yaml with config/<name>.yaml merged over it in order, as Snakemake and the CLI merge
    --configfile (snakemake.utils.update_config: nested sections merged key by key), registry paths absolute."""
    import yaml
    from snakemake.utils import update_config
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for name in names:
        update_config(config, yaml.safe_load((REPO / f"config/{name}.yaml").read_text()))
    config["registries"] = {k: str(REPO / v) if isinstance(v, str) else [str(REPO / x) for x in v]
                            for k, v in config["registries"].items()}
    return config


@pytest.fixture(scope="session")
def registries():
    from retinabench.registry import Registries
    return Registries(REPO / "config/datasets.yaml", REPO / "config/tasks.yaml", REPO / "config/encoders.yaml")


# Small copies of ../shared/data/tvhl in a temp dir, for tests that corrupt, change or add raw files.

def copy_tvhl(src: Path, dest: Path, n_cfp: int = 40, n_oct: int = 30) -> Path:
    """Rows spread evenly over each CSV (so every DME class is there) and their images, in their sub-folders
    (mtimes kept)."""
    dest.mkdir(parents=True)
    for csv, folder, n in (("EYE FUNDUS.csv", "EYE FUNDUS", n_cfp), ("OCT.csv", "OCT", n_oct)):
        table = pd.read_csv(src / csv, dtype=str, keep_default_na=False)
        on_disk = {p.stem: p for p in (src / folder).glob("*/*.jpg")}
        listed = table[table["Name"].str.strip().isin(on_disk)]
        keep = listed.iloc[[round(k * (len(listed) - 1) / (n - 1)) for k in range(n)]]
        keep.to_csv(dest / csv, index=False)
        for name in keep["Name"].str.strip():
            rel = on_disk[name].relative_to(src)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(on_disk[name], dest / rel)
    return dest


@pytest.fixture
def tvhl_copy(tvhl_root, tmp_path) -> Path:
    return copy_tvhl(tvhl_root, tmp_path / "data" / "tvhl")


def manifest_job(root: Path, results: Path, entry: dict | None = None, dataset: str = "tvhl"):
    """The manifest rule's job for a dataset entry (as workflow/rules/data.smk builds it)."""
    entry = {"name": dataset, "adapter": "tvhl", "root": dataset, "index_files": ["EYE FUNDUS.csv", "OCT.csv"],
             "modalities": ["cfp", "oct"], "web_exposure_risk": "high", **(entry or {})}
    from retinabench.pipeline import Job
    from retinabench.settings import ImagesSettings
    d = results / "data" / dataset
    return Job(rule="manifest", input={"index": [str(root / f) for f in entry["index_files"]]},
               output={"manifest": str(d / "manifest.parquet"), "exclusions": str(d / "exclusions.parquet"),
                       "hashes": str(d / "image_hashes.parquet"), "raw_files": str(d / "raw_files.parquet")},
               params={"dataset": entry, "root": str(root), "images": ImagesSettings().plain()},
               wildcards={"dataset": dataset}, threads=2)


@pytest.fixture(scope="session")
def make_manifest_job():
    return manifest_job


@pytest.fixture(scope="session")
def tiny_mllms(tmp_path_factory):
    """(tests/protocols, tests/pipeline) The tiny LLaVA, Qwen2-VL, LLaVA-NeXT and Gemma 3 (retinabench.models.tiny), built once:
    name -> (entry, folder)."""
    from retinabench.models.tiny import (build_tiny_gemma3, build_tiny_llava, build_tiny_llava_next,
                                                 build_tiny_qwen2_vl)
    root = tmp_path_factory.mktemp("tiny_mllms")
    return {name: (build(root / name), root / name)
            for name, build in (("tiny_llava", build_tiny_llava), ("tiny_qwen2_vl", build_tiny_qwen2_vl),
                                ("tiny_llava_next", build_tiny_llava_next), ("tiny_gemma3", build_tiny_gemma3))}


# One copy of the workflow for Snakemake dry runs (`-n`): the documented commands (tests/test_docs_commands.py) and
# the own-data path (tests/test_own_data.py) plan in it, so no .snakemake folder lands in the checkout.
def run_in_copy(workdir: Path, cmd: list[str], timeout: int = 600):
    import subprocess
    import sys
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="session")
def dry_run_workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("dry_run") / "repo"
    work.mkdir()
    for item in ("Snakefile", "workflow", "config", "profiles", "envs", "slurm"):
        src = REPO / item
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    return work


# `make test-fast` runs `pytest -m "not slow"`. Every test under these folders runs Snakemake end to end or a bench
# script's smoke run, so it is slow without a per-test decorator; heavier tests elsewhere carry @pytest.mark.slow.
SLOW_FOLDERS = ("workflow", "bench")


def pytest_collection_modifyitems(config, items):
    tests = REPO / "tests"
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(tests) and path.relative_to(tests).parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
