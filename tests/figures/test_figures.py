"""Every analysis family on synthetic tables: PNG + PDF per figure, tables, sidecars, deterministic output."""
import json
from pathlib import Path

import pandas as pd
import pytest

from retinabench.schemas import write_table
from retinabench.stages import Job, run_stage
from retinabench.stages_analysis import (ANALYSIS_DEFAULTS, AnalysisContext, FAMILIES, analysis_outputs,
                                         family_inputs, run_family)
from retinabench.stats.synthetic import (synthetic_lr_sweep, synthetic_metrics, synthetic_registries,
                                         synthetic_subgroups)

PROTOCOLS = ["knn", "linear", "finetune"]


@pytest.fixture(scope="module")
def study():
    encoders, tasks, datasets = synthetic_registries(7, 9, seed=1)  # 3 datasets: high risk, exposed, clean
    metrics = synthetic_metrics(encoders, tasks, protocols=PROTOCOLS, seeds=(0, 1), regimes=("u-u", "b-b"), seed=1)
    settings = ANALYSIS_DEFAULTS | {"subgroup_metrics": "subgroups.parquet", "lr_sweep_metrics": "lr.parquet",
                                    "alternative_metrics": ["auroc"]}
    ctx = AnalysisContext(encoders=encoders, tasks=tasks, datasets=datasets, protocols=PROTOCOLS,
                          regimes=["u-u", "b-b"], ranking={"metric": "accuracy", "regime": "u-u"},
                          settings=settings, lr_source="lr.parquet")
    tables = {"metrics": metrics, "subgroups": synthetic_subgroups(metrics[metrics["protocol"] == "linear"]),
              "lr_sweep": synthetic_lr_sweep(metrics)}
    return ctx, tables


def run_all(ctx, tables, root: Path) -> dict:
    outputs = analysis_outputs(ctx, str(root))
    tables = dict(tables)
    for family, out in outputs.items():
        if family != "ranks":
            tables.setdefault("ranks", pd.read_parquet(outputs["ranks"]["ranks"]))
        run_family(family, tables, AnalysisContext.from_params(ctx.params_for(family)), out)
    return outputs


def test_every_family_writes_png_pdf_and_tables(study, tmp_path_factory):
    ctx, tables = study
    root = tmp_path_factory.mktemp("analysis")
    outputs = run_all(ctx, tables, root)
    assert set(outputs) == set(FAMILIES)  # this synthetic study has every input, so every family runs
    for family, out in outputs.items():
        for key, path in out.items():
            data = Path(path).read_bytes()
            if path.endswith(".png"):
                assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, path
                assert Path(path).with_suffix(".pdf").is_file(), f"{path}: no PDF twin"
            elif path.endswith(".pdf"):
                assert data[:5] == b"%PDF-" and b"CreationDate" not in data, path
            elif path.endswith(".csv"):
                assert len(pd.read_csv(path)) > 0, path
    friedman = pd.read_csv(outputs["cd"]["friedman"])
    assert set(friedman["metric"]) == {"accuracy", "auroc"}
    assert set(friedman["protocol"]) == set(PROTOCOLS) and (friedman["k"] == 7).all()
    kw = pd.read_csv(outputs["distance"]["kruskal"])
    assert set(kw["group_by"]) == {"domain", "method"}
    assert kw.loc[kw["group_by"] == "method", "p"].between(0, 1).all()  # 5 methods for 7 encoders
    by_domain = kw[kw["group_by"] == "domain"]  # 7 encoders, 7 domains: one per group, KW undefined (noted)
    assert by_domain["p"].isna().all() and (by_domain["note"] == "one encoder per group: test undefined").all()
    leak = pd.read_csv(outputs["leakage"]["table"])
    assert set(leak["subset"]) == {"no_known_exposure", "low_risk"}
    assert (leak.groupby("subset")["position_change"].sum().abs() < 1e-9).all()  # positions are a permutation
    gap = pd.read_csv(outputs["ft_lp"]["table"])
    assert len(gap) == 7 and gap["params_m"].gt(0).all()


def test_figures_are_deterministic(study, tmp_path):
    ctx, tables = study
    out_a = analysis_outputs(ctx, str(tmp_path / "a"))
    out_b = analysis_outputs(ctx, str(tmp_path / "b"))
    for out in (out_a, out_b):
        run_family("ranks", tables, AnalysisContext.from_params(ctx.params_for("ranks")), out["ranks"])
        ranks = pd.read_parquet(out["ranks"]["ranks"])
        for family in ("cd", "distance"):
            run_family(family, tables | {"ranks": ranks}, AnalysisContext.from_params(ctx.params_for(family)),
                       out[family])
    for family in ("cd", "distance"):
        for key in out_a[family]:
            assert Path(out_a[family][key]).read_bytes() == Path(out_b[family][key]).read_bytes(), key


def test_stage_writes_sidecars_chaining_to_the_metrics_table(study, tmp_path):
    ctx, tables = study
    results = tmp_path / "results"
    metrics_path = results / "metrics.parquet"
    write_table(tables["metrics"], metrics_path, "metrics")
    outputs = analysis_outputs(ctx, str(results))
    for family in ("ranks", "cd"):
        job = Job(rule=family, input=family_inputs(family, str(results), ctx), output=outputs[family],
                  params={"code": "abc", **ctx.params_for(family)})
        run_stage(f"analysis_{family}", job)
    side = json.loads(Path(outputs["cd"]["png"] + ".prov.json").read_text())
    assert side["rule"] == "cd" and side["inputs"][0]["path"] == outputs["ranks"]["ranks"]
    assert side["config"]["settings"]["alpha"] == 0.05 and side["config"]["code"] == "abc"
    assert "encoders" in side["extra"]["registry_fields"]
    from retinabench.provenance import provenance_chain
    chain = [n["path"] for n in provenance_chain(outputs["cd"]["png"])]
    assert chain[:3] == [outputs["cd"]["png"], outputs["ranks"]["ranks"], str(metrics_path)]


def test_family_must_write_exactly_what_it_declares(study, tmp_path):
    ctx, tables = study
    out = dict(analysis_outputs(ctx, str(tmp_path))["ranks"])
    out["extra"] = str(tmp_path / "never.csv")
    with pytest.raises(RuntimeError, match="did not write"):
        run_family("ranks", tables, AnalysisContext.from_params(ctx.params_for("ranks")), out)
    with pytest.raises(KeyError, match="needs input"):
        run_family("cd", {"metrics": tables["metrics"]}, ctx, analysis_outputs(ctx, str(tmp_path))["cd"])


def test_rank_distribution_requires_a_metric_for_multi_metric_tables(study, tmp_path):
    from retinabench.figures.ranks import rank_distribution_figure
    from retinabench.stats.ranks import rank_tables
    ctx, tables = study
    ranks = rank_tables(tables["metrics"], ["accuracy", "auroc"])
    with pytest.raises(ValueError, match="pass metric="):
        rank_distribution_figure(ranks, ctx.encoders, tmp_path / "x.png")
    paths = rank_distribution_figure(ranks, ctx.encoders, tmp_path / "x.png", metric="auroc",
                                     protocols=["linear", "knn"])
    assert [Path(p).suffix for p in paths] == [".png", ".pdf"]
