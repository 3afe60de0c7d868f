"""A tiny copy of the workflow (.test/config/config.yaml: phantom data, two offline encoders) run once per test
session."""
import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pandas as pd
import yaml
from snakemake.utils import update_config  # merged(): the merge snakemake and retinabench's CLI apply

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


SNAKEMAKE_ARGS = ("--profile", "profiles/local", "--cores", "2", "--configfile", "config/tiny.yaml")


def _run(workdir: Path, cmd: list[str], what: str, check: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(workdir, [SNAKEMAKE, *SNAKEMAKE_ARGS, *args], f"snakemake {' '.join(args)}", check)


def build_report(workdir: Path, report: str | Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`retinabench report REPORT` (snakemake --report, escaped: retinabench.report_build) in a workflow copy, with
    the arguments of :func:`snakemake` and ``args`` (a flag before any target: --configfile takes several files)."""
    cmd = [sys.executable, "-m", "retinabench", "report", str(report), *SNAKEMAKE_ARGS, *args]
    return _run(workdir, cmd, f"retinabench report {report} {' '.join(args)}", check)


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory) -> Path:
    """Workdir of a finished tiny run; tests may read it but must copy it before changing anything."""
    workdir = copy_workflow(tmp_path_factory.mktemp("wf") / "repo", TINY)
    run = snakemake(workdir)
    (workdir / "run.log").write_text(run.stdout + run.stderr)  # what the console showed (tests read it)
    return workdir


def merged(*configs: dict) -> dict:
    """Config files merged the way Snakemake merges several --configfile values (nested mappings key by key)."""
    out: dict = {}
    for c in configs:
        update_config(out, copy.deepcopy(c))
    return out


@pytest.fixture(scope="session")
def prompted_demo(tmp_path_factory) -> dict:
    """One run serving the demo tests of the prompt-based protocols and LoRA: config/interfaces_demo.yaml merged
    with config/mllm_demo.yaml (as `--configfile` both would be), targets `interfaces` and `lora` — the tiny models
    built once, zero-shot and MLLM prompting, their reliability tables, LoRA training, adapter inference and the
    deltas, in the results folder of the last of them (``R``). Tests may read it but must copy it before changing
    anything."""
    demo = merged(*(yaml.safe_load((REPO / f"config/{n}.yaml").read_text()) for n in ("interfaces_demo",
                                                                                       "mllm_demo")))
    work = copy_workflow(tmp_path_factory.mktemp("prompted_demo") / "repo", demo)
    proc = snakemake(work, "--keep-going", "interfaces", "lora")  # a flag first: --configfile takes several files
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", proc.stdout + proc.stderr, re.M)}
    return {"work": work, "R": work / demo["results"], "counts": counts, "proc": proc}


@pytest.fixture(scope="session")
def run_snakemake():
    """The `snakemake(workdir, *args, check=True)` helper, for tests that run the workflow themselves."""
    return snakemake


@pytest.fixture(scope="session")
def report_builder():
    """The `build_report(workdir, report, *args, check=True)` helper: the HTML report the way `make report` builds
    it."""
    return build_report


@pytest.fixture(scope="session")
def make_workflow_copy():
    """The `copy_workflow(dest, overrides)` helper: a fresh copy of the workflow with config/tiny.yaml."""
    return copy_workflow


def run_config(workdir: Path) -> dict:
    """The merged config a workflow copy ran with (config.yaml + tiny.yaml), registry paths made absolute."""
    config = {}
    for f in ("config/config.yaml", "config/tiny.yaml"):
        config.update(yaml.safe_load((workdir / f).read_text()))
    for k in ("datasets", "tasks", "encoders"):
        config["registries"][k] = str(workdir / config["registries"][k])
    return config


def render_run_figures(workdir: Path, dest: Path, *, families=None, reliability=True) -> list[dict]:
    """Draw every figure type a finished run produced again, from that run's own tables, through the same
    functions its jobs call, and return what figures.style.save recorded for each (size, layout problems).
    ``families``: the analysis families to draw (default: every planned family that has figures)."""
    from retinabench.data.derived import transfer_groups
    from retinabench.figures.reliability import FIGURES
    from retinabench.figures.style import recording
    from retinabench.analysis import AnalysisContext
    from retinabench.plan.family_outputs import analysis_outputs, family_inputs
    from retinabench.analysis.families import read_input, run_family
    from retinabench.settings import ReliabilitySettings
    from retinabench.plan.selection import plan
    config = run_config(workdir)
    p = plan(config)
    ctx = AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    results = str(workdir / config["results"])
    outputs = analysis_outputs(ctx, str(dest / "results"))
    with recording() as saved:
        for family, out in outputs.items():
            if not any(k.startswith("png") for k in out) or (families is not None and family not in families):
                continue
            inputs = {k: read_input(k, path) for k, path in family_inputs(family, results, ctx).items()}
            run_family(family, inputs, AnalysisContext.from_params(ctx.params_for(family)), out)
        if reliability:
            settings = ReliabilitySettings.from_config(config).plain()
            protocols = config["protocols"]
            sel = {**settings["figures"], "protocol": settings["figures"]["protocol"]
                   or ("linear" if "linear" in protocols else protocols[0])}
            encoders = {e: p.registries.encoder(e) for e in p.encoders}
            groups = transfer_groups({t: p.registries.task(t) for t in p.tasks})
            rel = Path(results) / "reliability"
            for name, fn in FIGURES.items():
                if name == "transfer" and not groups:
                    continue
                tables = {k: pd.read_parquet(rel / f"{k}.parquet") for k in ("bins", "calibration", "gaps",
                                                                              "subgroups", "metrics")}
                fn(tables, encoders, dest / "reliability" / name, sel, groups=groups)
    return saved


def figure_type(path: str) -> str:
    """The figure type of a rendered file: its stem without metric or part suffixes, or its reliability folder."""
    path = Path(path)
    if path.parent.parent.name == "reliability":
        return path.parent.name
    stem = path.stem
    for suffix in ("_balanced_accuracy", "_auroc"):
        stem = stem.removesuffix(suffix)
    return stem.split("_part")[0]


def assert_print_quality(saved: list[dict], expected_types: set[str]) -> None:
    """Every rendered figure fits the publication targets (figures/style.py) and no text leaves the canvas."""
    from retinabench.figures.style import MAX_HEIGHT_MM, WIDTH_MM
    types = {figure_type(s["path"]) for s in saved}
    assert expected_types <= types, f"figure types not rendered: {sorted(expected_types - types)}"
    bad = {s["path"]: s["problems"] for s in saved if s["problems"]}
    assert not bad, bad
    for s in saved:
        assert s["width_mm"] <= WIDTH_MM["double"] + 0.5 and s["height_mm"] <= MAX_HEIGHT_MM + 0.5, s


@pytest.fixture(scope="session")
def figure_checks():
    """(render_run_figures, assert_print_quality) for the workflow tests' runs."""
    return render_run_figures, assert_print_quality
