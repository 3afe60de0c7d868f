"""Parsing the Snakefile (every Slurm job re-parses it) needs no torch: the planner and settings are torch-free."""
import os

import pytest


@pytest.mark.parametrize("configfile", ["config/config.yaml", "config/finetune_demo.yaml"])
def test_snakefile_parses_without_torch(tmp_path, monkeypatch, make_workflow_copy, run_snakemake, configfile):
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('torch imported while parsing the Snakefile')\n")
    workdir = make_workflow_copy(tmp_path / "repo", {})
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(poison.parent)] + ([old] if old else [])))
    proc = run_snakemake(workdir, "-n", "--quiet", "rules", "--configfile", configfile, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch imported" not in proc.stderr


def test_snakemake_lint_is_clean(tmp_path, make_workflow_copy, run_snakemake):
    """`.smk` files declare rules only (the plan is in the package), every rule has log: and conda:."""
    workdir = make_workflow_copy(tmp_path / "repo", {})
    proc = run_snakemake(workdir, "--lint", "--configfile", "config/finetune_demo.yaml", check=False)
    assert proc.returncode == 0 and "good condition" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
