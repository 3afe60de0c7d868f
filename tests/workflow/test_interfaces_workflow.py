"""The prompt-based protocols in the workflow (dry run, no model): enabling `zeroshot:` / `mllm:` adds one GPU job
per (entry, task set) per interface, their reliability evaluation jobs and the interface tables; nothing else
changes, and the Snakefile still parses without torch. (Real runs: tests/pipeline/test_interfaces_stage.py runs the
stages on the tiny models.)"""
import re

import yaml

from tests.workflow.conftest import TINY


def fake_lock(workdir, names):
    from retinabench.registry.lockfile import lock_name, needs_lock, pins_of, write_lock
    from retinabench.registry import load_registry
    encoders = load_registry(workdir / "config/encoders.yaml", "encoders")
    records = {lock_name(encoders[n]): {"pins": pins_of(encoders[n]), "revision": "0" * 40, "locked_at": "fake",
                                        "files": {f: "0" * 64 for f in pins_of(encoders[n])["files"]}}
               for n in names if needs_lock(encoders[n])}
    write_lock(workdir / "config/encoders.lock.yaml", records)


def rule_counts(stdout: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stdout, re.M)}


def test_enabling_the_interfaces_adds_their_jobs_and_nothing_else(tmp_path, make_workflow_copy, run_snakemake):
    zs, ml = ["clip_vitb32_openai", "siglip2_base_patch16_224"], ["medgemma_4b_it"]
    prompted = dict(TINY, zeroshot={"enabled": True, "encoders": zs}, mllm={"enabled": True, "encoders": ml})
    base = make_workflow_copy(tmp_path / "base", TINY)
    work = make_workflow_copy(tmp_path / "prompted", prompted)
    before = rule_counts(run_snakemake(base, "-n", "--quiet", "rules").stdout)
    refused = run_snakemake(work, "-n", "--quiet", "rules", check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "zeroshot / mllm" in said and "medgemma_4b_it" in said, said[-2000:]
    fake_lock(work, zs + ml)
    proc = run_snakemake(work, "-n", "--quiet", "rules")
    after = rule_counts(proc.stdout)
    assert after["zeroshot"] == 2 and after["mllm"] == 1 and after["interface_tables"] == 1
    added = {r: after.get(r, 0) - before.get(r, 0) for r in after}
    # + FOCUS's figures that need zero-shot / MLLM results (probe vs zero-shot, MLLM size vs AUROC)
    assert {r: n for r, n in added.items() if n} == {"zeroshot": 2, "mllm": 1, "interface_tables": 1,
                                                     "reliability": 3, "focus_figure": 2, "total": 9}, added
    assert "not run: no zeroshot prompt set covers it" in proc.stderr  # the phantom's non-harmonised tasks
    assert yaml.safe_load((work / "config/tiny.yaml").read_text())["mllm"]["encoders"] == ml


def test_the_interfaces_demo_runs_through_snakemake_on_the_phantom_with_the_tiny_models(prompted_demo):
    """config/interfaces_demo.yaml (with config/mllm_demo.yaml: one shared run, targets `interfaces` and `lora`):
    rule tiny_model builds the demo registry's two models (sha256-pinned folders, verified on load), both
    interfaces run on the phantom, and the interface tables and the reliability tables of both sources come out
    (random models: chance level; the counts are what is pinned)."""
    import pandas as pd
    counts = prompted_demo["counts"]
    assert counts["tiny_model"] == 2 and counts["zeroshot"] == 1 and counts["mllm"] == 1
    assert counts["reliability"] == 2 and counts["interface_tables"] == 1
    assert not any(k in counts for k in ("features", "frozen", "collect_metrics")), counts
    R = prompted_demo["R"]
    zs = pd.read_parquet(R / "predictions/zeroshot/tiny_siglip/all.parquet")
    ml = pd.read_parquet(R / "predictions/mllm/tiny_qwen2_vl/all.parquet")
    assert set(zs["protocol"].str.split("@").str[0]) == {"zeroshot", "zeroshot_focus"}
    assert set(ml["protocol"].str.split("@").str[0]) == {"mllm", "mllm_renorm"} and ml["answer"].notna().all()
    metrics = pd.read_parquet(R / "metrics/mllm/tiny_qwen2_vl/all.parquet")
    invalid = metrics[metrics["metric"] == "invalid_rate"]
    assert len(invalid) and invalid["value"].between(0, 1).all()
    assert len(pd.read_parquet(R / "interfaces/prompt_sensitivity.parquet"))
    ece = pd.read_parquet(R / "interfaces/zeroshot_ece_difference.parquet")
    assert set(ece["encoder"]) == {"tiny_siglip"} and ece["ece_diff"].notna().all()
    for source, entry in (("zeroshot", "tiny_siglip"), ("mllm", "tiny_qwen2_vl")):
        subgroups = pd.read_parquet(R / f"reliability/jobs/{source}/{entry}/all/subgroups.parquet")
        assert len(subgroups) and set(subgroups["encoder"]) == {entry}
    prov = (R / "logs/zeroshot/tiny_siglip/all.log").read_text() if (R / "logs").exists() else ""
    assert "Traceback" not in prov
