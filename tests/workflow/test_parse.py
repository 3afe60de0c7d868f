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


def _dry_run_jobs(text: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(rule, outputs, wildcards) of every job in `snakemake -n` output."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        outputs = re.search(r"^\s+output: (.+)$", block, re.M)
        wildcards = re.search(r"^\s+wildcards: (.+)$", block, re.M)
        values = dict(kv.split("=", 1) for kv in wildcards.group(1).split(", ")) if wildcards else {}
        jobs.append((m.group(1), outputs.group(1).split(", ") if outputs else [], values))
    return jobs


@pytest.mark.parametrize("configfile", ["config/finetune_demo.yaml", "config/mllm_demo.yaml"])
def test_targets_lists_every_output_of_an_encoder_and_a_task(tmp_path, make_workflow_copy, run_snakemake,
                                                             configfile):
    """`retinabench targets --encoder E` / `--task T` against the workflow's own DAG: every path listed is an
    output of a job of the default target, and every job whose wildcards name E (or T) has all its outputs listed
    (features, probes, fine-tunes and sweeps, transfer, interfaces, LoRA, reliability, saliency, compute)."""
    import subprocess
    import sys
    workdir = make_workflow_copy(tmp_path / "repo", {})
    proc = run_snakemake(workdir, "-n", "--configfile", configfile, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _dry_run_jobs(proc.stdout)
    produced = {o for _, outputs, _ in jobs for o in outputs}
    encoder = next(v["encoder"] for _, _, v in jobs if "encoder" in v)
    task = next(v["task"] for _, _, v in jobs if "task" in v)
    for option, value in (("--encoder", encoder), ("--task", task)):
        out = subprocess.run([sys.executable, "-m", "retinabench", "targets", "--configfile", configfile, option,
                              value], cwd=workdir, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        listed = set(out.stdout.split())
        assert listed and listed <= produced, sorted(listed - produced)
        key = option[2:]
        own = {o for _, outputs, v in jobs if v.get(key) == value for o in outputs}
        assert own and own <= listed, sorted(own - listed)
        assert any("figures/" in p for p in listed) and any("metrics.parquet" in p for p in listed)
