"""Issue 23's faults, each reproduced as a hostile or unlucky user met it, on generated fixtures: what happened
then, and what happens now. One section per fault; the workflow-level tests reuse the session's tiny run
(tests/workflow/conftest.py) through copies."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def cli(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retinabench", *args], cwd=work, capture_output=True, text=True,
                          timeout=600)


def rewrite_keeping_mtime(path: Path, change) -> None:
    """Rewrite a file in place as `cp -p` / `touch -r` would leave it: same path, same inode, old mtime."""
    st = path.stat()
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def permute_rows(path: Path) -> None:
    table = pd.read_parquet(path)
    table.iloc[::-1].reset_index(drop=True).to_parquet(path, index=False)  # same schema, rows reversed


def sidecar_job(tmp_path: Path, n_parts: int = 2):
    """Parts written by one rule and an aggregate written from them by another, each with its sidecar, through the
    pipeline's one writer (retinabench.pipeline.job.write_outputs)."""
    from retinabench.pipeline import Job, write_outputs
    parts = []
    for i in range(n_parts):
        out = tmp_path / f"metrics/frozen/enc/task{i}.parquet"
        job = Job(rule="frozen", input={}, output={"metrics": str(out)}, wildcards={"encoder": "enc", "task": f"task{i}"})
        write_outputs(job, {"metrics": pd.DataFrame({"task": [f"task{i}"], "value": [0.5 + i / 10]})})
        parts.append(str(out))
    agg = Job(rule="collect_metrics", input={"metrics": parts}, output={"metrics": str(tmp_path / "metrics.parquet")})
    write_outputs(agg, {"metrics": pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)})
    return parts, str(tmp_path / "metrics.parquet")


# --- fault 1: a changed intermediate is used silently ---

def test_fault1_a_changed_input_stops_the_job_naming_file_rule_and_rebuild(tmp_path):
    from retinabench.integrity import ArtifactChanged
    from retinabench.pipeline import Job, run_stage
    from retinabench.pipeline.registry import STAGES
    parts, _ = sidecar_job(tmp_path, n_parts=3)
    rewrite_keeping_mtime(Path(parts[1]), permute_rows)  # one row: reversing keeps the bytes
    rewrite_keeping_mtime(Path(parts[2]), lambda p: pd.DataFrame({"task": ["x"], "value": [0.9]}).to_parquet(p))
    ran = []
    STAGES.add("fault1_consumer", lambda job: ran.append(job))
    job = Job(rule="fault1_consumer", input={"metrics": parts}, output={"out": str(tmp_path / "out.parquet")})
    with pytest.raises(ArtifactChanged) as err:
        run_stage("fault1_consumer", job)
    text = str(err.value)
    assert not ran, "the stage ran on a changed input"
    assert parts[2] in text and "CHANGED" in text and "rule frozen (encoder=enc, task=task2)" in text
    assert f"--force {parts[2]}" in text and parts[0] not in text


@pytest.mark.slow
def test_fault1_permuted_features_with_restored_mtime_are_refused_and_flagged(tiny_workflow, tmp_path, run_snakemake):
    """The reported fault: one encoder's feature rows permuted in place, mtime restored; the next run used them
    (715 of 2,256 metric rows changed), provenance showed 0 CHANGED and exited 0."""
    work = tmp_path / "repo"
    shutil.copytree(tiny_workflow, work, symlinks=True)
    features = work / "results/features/vit_tiny_random/phantom.parquet"
    rewrite_keeping_mtime(features, permute_rows)
    # the next run that reads it (forced, as a change elsewhere would) stops before using it
    target = "results/metrics/frozen/vit_tiny_random/phantom_cfp_dr3.parquet"
    run = run_snakemake(work, "--force", target, check=False)
    assert run.returncode != 0
    assert "results/features/vit_tiny_random/phantom.parquet" in run.stderr
    assert "rule features (dataset=phantom, encoder=vit_tiny_random)" in run.stderr
    assert "--force results/features/vit_tiny_random/phantom.parquet" in run.stderr
    # verify names it and exits 1; the provenance chain of a figure built from it flags it and exits 1
    verify = cli(work, "verify", "--configfile", "config/tiny.yaml")
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert "CHANGED  results/features/vit_tiny_random/phantom.parquet" in verify.stdout
    prov = cli(work, "provenance", "results/figures/rank_distribution.png")
    assert prov.returncode == 1
    flagged = [line.strip() for line in prov.stdout.splitlines()
               if line.strip().startswith("results/features/vit_tiny_random/phantom.parquet [CHANGED")]
    assert flagged, prov.stdout
    # rebuilding as the message says makes everything consistent again
    run_snakemake(work, "--force", "results/features/vit_tiny_random/phantom.parquet")
    run_snakemake(work)
    assert cli(work, "verify", "--configfile", "config/tiny.yaml").returncode == 0


# --- fault 8: missing inputs go unmentioned ---

def test_fault8_a_missing_raw_folder_is_named_at_start(tmp_path, capsys):
    from retinabench.pipeline.plan import WorkflowPlan
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.update(yaml.safe_load((REPO / "config/tvhl.yaml").read_text()))
    config.update(data_root=str(tmp_path / "data"), results=str(tmp_path / "results"))
    manifest = tmp_path / "results/data/tvhl/manifest.parquet"
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(b"")  # built earlier; the raw folder has gone since
    plan = WorkflowPlan(config)
    notes = plan.missing_raw_folders()
    assert len(notes) == 1 and "raw folder of dataset tvhl is missing" in notes[0]
    assert str(tmp_path / "data" / "tvhl") in notes[0] and "nothing depending on it is rerun" in notes[0]
    manifest.unlink()  # never built: Snakemake itself reports the missing index files
    assert plan.missing_raw_folders() == []


def test_fault8_cli_output_survives_a_closed_pipe(tmp_path):
    parts, agg = sidecar_job(tmp_path)
    # `provenance --json | head -1`: the reader leaves after one line
    proc = subprocess.Popen(f"{sys.executable} -m retinabench provenance --json {agg} | head -1", shell=True,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert out.strip() == "{" and "Traceback" not in err and "BrokenPipeError" not in err, err


# --- fault 9: a failed run leaves a results table that looks current ---

def test_fault9_an_aggregate_whose_inputs_changed_or_vanished_is_flagged_stale(tmp_path):
    from retinabench.integrity import report_stale, results_findings, stale_targets
    from retinabench.pipeline import Job, write_outputs
    parts, agg = sidecar_job(tmp_path, n_parts=3)
    findings, n = results_findings(tmp_path)
    assert findings == [] and n == 4
    # the next run rebuilt one part (new content, new sidecar) and failed on another (Snakemake deleted it)
    rebuilt = Job(rule="frozen", input={}, output={"metrics": parts[0]}, wildcards={"encoder": "enc", "task": "task0"})
    write_outputs(rebuilt, {"metrics": pd.DataFrame({"task": ["task0"], "value": [0.99]})})
    Path(parts[2]).unlink()
    Path(parts[2] + ".prov.json").unlink()
    stale = stale_targets([agg])
    assert [f.status for f in stale] == ["STALE", "STALE"]
    assert f"input {parts[0]} changed since rule collect_metrics used it" in stale[0].detail
    assert f"input {parts[2]} is gone" in stale[1].detail
    findings, _ = results_findings(tmp_path)
    assert {(f.status, f.path) for f in findings} == {("STALE", agg)}
    import io
    buf = io.StringIO()
    report_stale([agg], file=buf)
    assert "this run failed; 2 result(s) left from an earlier run no longer match their inputs" in buf.getvalue()


def test_fault9_verify_exits_1_on_a_stale_table_and_0_when_consistent(tmp_path):
    parts, agg = sidecar_job(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"results": str(tmp_path)}))
    ok = cli(REPO, "verify", "--configfile", str(config))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    Path(parts[1]).unlink()
    bad = cli(REPO, "verify", "--configfile", str(config))
    assert bad.returncode == 1 and f"STALE    {agg}" in bad.stdout and "1 STALE" in bad.stdout, bad.stdout
