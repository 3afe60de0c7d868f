"""Parsing the Snakefile (every Slurm job re-parses it) needs no torch: the planner and settings are torch-free."""
import os
import re

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


def _dag(dot: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Nodes {id: label} and edges {(upstream, downstream)} of `snakemake --dag` output."""
    nodes = dict(re.findall(r'^\s*(\d+)\[label = "([^"]*)"', dot, re.M))
    edges = set(re.findall(r"^\s*(\d+) -> (\d+)$", dot, re.M))
    return nodes, edges


def test_a_job_reads_only_what_it_declares_tiny_model_weights(tmp_path, make_workflow_copy, run_snakemake):
    """config/mllm_demo.yaml's default target: the features jobs of tiny_siglip (local weights in the results
    folder) declare its weights folder, so rule tiny_model runs before them (old: `weight file
    results/tiny_models/tiny_siglip not found`)."""
    workdir = make_workflow_copy(tmp_path / "repo", {})
    proc = run_snakemake(workdir, "-n", "--dag", "--configfile", "config/mllm_demo.yaml", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nodes, edges = _dag(proc.stdout)
    features = {i for i, label in nodes.items() if label.startswith("features\\n") and "tiny_siglip" in label}
    builder = [i for i, label in nodes.items() if label == "tiny_model\\nname: tiny_siglip"]
    assert features and len(builder) == 1, nodes
    assert all((builder[0], f) in edges for f in features), (builder, features, sorted(edges))
