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
