"""Every analysis family on synthetic tables: PNG + PDF per figure, tables, sidecars, deterministic output."""
import json
from pathlib import Path

import pandas as pd
import pytest

from retinabench.schemas import write_table
from retinabench.analysis import FAMILIES, AnalysisContext
from retinabench.plan.family_outputs import analysis_outputs, family_inputs
from retinabench.analysis.families import run_family
from retinabench.pipeline import Job, run_stage
from retinabench.settings import AnalysisSettings
from retinabench.testing.synthetic import (synthetic_baselines, synthetic_metrics, synthetic_registries,
                                         synthetic_subgroups, synthetic_sweep)

ANALYSIS_DEFAULTS = AnalysisSettings().plain()

PROTOCOLS = ["knn", "linear", "linear_aug", "finetune"]
ATTRIBUTES = [{"name": "age", "column": "age", "cut": 60, "groups": None},
              {"name": "sex", "column": "sex", "cut": None, "groups": ["female", "male"]}]


def synthetic_manifests(datasets, n: int = 20):
    """Manifest rows (dataset, image_id, age, sex) for Table 1; a few unknown values."""
    rows = [{"image_id": f"{d}_{i}", "dataset": d, "age": None if i % 7 == 0 else 40.0 + i * 2,
             "sex": None if i % 9 == 0 else ("female" if i % 2 else "male")} for d in datasets for i in range(n)]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def study():
    encoders, tasks, datasets = synthetic_registries(7, 9, seed=1)  # 3 datasets: high risk, exposed, clean
    metrics = synthetic_metrics(encoders, tasks, protocols=PROTOCOLS, seeds=(0, 1), regimes=("u-u", "b-b"), seed=1)
    settings = ANALYSIS_DEFAULTS | {"alternative_metrics": ["auroc"]}
    grid, sensitivity = synthetic_sweep(encoders, ["task00", "task01"], seed=1)
    ctx = AnalysisContext(encoders=encoders, tasks=tasks, datasets=datasets, protocols=PROTOCOLS,
                          regimes=["u-u", "b-b"], ranking={"metric": "accuracy", "regime": "u-u"},
                          settings=settings, lr_source="sweep/lr_sensitivity.parquet",
                          lr_grid="sweep/lr_sweep_metrics.parquet", subgroup_source="reliability/subgroups.parquet",
                          sweep_tasks={"sweep": "task00", "check": "task01"}, attributes=ATTRIBUTES)
    tables = {"metrics": metrics, "subgroups": synthetic_subgroups(metrics[metrics["protocol"] == "finetune"]),
              "lr_sweep": sensitivity, "lr_grid": grid, "baselines": synthetic_baselines(tasks),
              "manifests": synthetic_manifests(datasets)}
    return ctx, tables


def run_all(ctx, tables, root: Path) -> dict:
    outputs = analysis_outputs(ctx, str(root))
    tables = dict(tables)
    for family, out in outputs.items():
        if family != "ranks":
            tables.setdefault("ranks", pd.read_parquet(outputs["ranks"]["ranks"]))
        run_family(family, tables, AnalysisContext.from_params(ctx.params_for(family)), out)
    return outputs


@pytest.mark.slow
def test_every_family_writes_png_pdf_and_tables(study, tmp_path_factory):
    from retinabench.figures.style import recording
    ctx, tables = study
    root = tmp_path_factory.mktemp("analysis")
    with recording() as saved:
        outputs = run_all(ctx, tables, root)
    assert set(outputs) == set(FAMILIES)  # this synthetic study has every input, so every family runs
    # every figure type at print size, nothing clipped (figures/style.py targets); the workflow tests check the
    # same on the pipeline's own outputs
    assert len(saved) == sum(k.startswith("png") for out in outputs.values() for k in out)
    assert {s["path"]: s["problems"] for s in saved if s["problems"]} == {}
    assert all(s["width_mm"] <= 180.5 and s["height_mm"] <= 240.5 for s in saved)
    for _family, out in outputs.items():
        for _key, path in out.items():
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
    # fine-tuning is ranked: it is the analysis protocol, named in the tables
    assert set(friedman.loc[friedman["role"] == "headline", "protocol"]) == {"finetune"}
    assert set(pd.read_csv(outputs["leakage"]["table"])["protocol"]) == {"finetune"}
    assert set(pd.read_csv(outputs["top_k"]["table"])["protocol_role"]) == {"headline"}
    dist = pd.read_csv(outputs["distance"]["table"])
    assert {"reference", "comparison", "distance", "meaning"} <= set(dist.columns)
    ft_pairs = dist[(dist["family"] == "protocols") & dist["name"].str.contains("finetune")]
    assert set(ft_pairs["reference"]) == {"finetune"}
    kw = pd.read_csv(outputs["distance"]["kruskal"])
    assert set(kw["group_by"]) == {"domain_group", "method_group"}
    assert kw.loc[kw["group_by"] == "method_group", "p"].between(0, 1).all()  # 5 method groups for 7 encoders
    # 7 encoders of 7 domains: the paper's groups (retinal 3, other 2: radiology and untrained, natural, pathology)
    # leave groups of more than one encoder, so the test is defined
    by_domain = kw[kw["group_by"] == "domain_group"]
    assert by_domain["p"].between(0, 1).all()
    assert set(by_domain["groups"]) == {"retinal (n=3); other (n=2); natural (n=1); pathology (n=1)"}
    # the paper's figures: Fig. 4 / A.3 under the paper's linear probe, Table 1, the OCT panel, and the cached
    # `linear` probe only in the extended protocol figures
    assert {"png_linear_probe"} <= set(outputs["rank_figures"]) and "png_linear_probe" in outputs["cd"]
    paper_pairs = set(dist.loc[dist["family"] == "protocols", "name"])
    assert "linear_aug vs linear" in paper_pairs  # the table keeps every pair; the paper figure leaves it out
    table1 = pd.read_csv(outputs["attributes"]["attributes_csv"])
    assert set(table1["dataset"]) == set(ctx.datasets) and set(table1["attribute"]) == {"age", "sex"}
    oct_top = pd.read_csv(outputs["top_k"]["table_oct"])
    assert set(oct_top["panel"]) == {"oct"}
    assert oct_top["n_tasks"].iloc[0] == sum(m["modality"] == "oct" for m in ctx.tasks.values())
    leak = pd.read_csv(outputs["leakage"]["table"])
    assert set(leak["subset"]) == {"no_known_exposure", "low_risk"}
    assert (leak.groupby("subset")["position_change"].sum().abs() < 1e-9).all()  # positions are a permutation
    gap = pd.read_csv(outputs["ft_lp"]["table"])
    assert len(gap) == 7 and gap["params_m"].gt(0).all() and {"finetune", "linear_aug"} <= set(gap.columns)
    sens = pd.read_csv(outputs["sensitivity"]["table"])
    assert set(sens["tasks"]) == {"task00"}  # the sweep task alone
    srd_lr = pd.read_csv(outputs["sensitivity"]["distance"])
    assert {"size_class", "reference", "comparison", "meaning"} <= set(srd_lr.columns)
    transfer = pd.read_csv(outputs["lr_transfer"]["table"])
    assert set(transfer["task"]) == {"task00", "task01"} and set(transfer["split"]) == {"val"}


@pytest.mark.slow
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
        run_stage(FAMILIES[family].rule, job)
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


@pytest.fixture
def captured(monkeypatch):
    """Figures drawn by the figure modules, kept (not saved) so a test can read their bars, points and titles."""
    from retinabench.figures import bars, scatter
    figs = []

    def keep(fig, png):
        figs.append(fig)
        return [str(png), str(Path(png).with_suffix(".pdf"))]

    monkeypatch.setattr(bars, "save", keep)
    monkeypatch.setattr(scatter, "save", keep)
    return figs


def test_distance_figure_draws_group_means_with_encoders_as_points(captured, tmp_path):
    # OcularBench's signed-distance figures: a bar per pretraining domain at the group mean, each encoder a point,
    # groups ordered by size, the Kruskal-Wallis p in the title
    import math

    from retinabench.figures.bars import distance_bars
    from retinabench.stats.distance import distance_rows, kruskal_table, with_groups
    domains = {"n1": "natural", "n2": "natural", "n3": "natural", "c1": "cfp", "c2": "oct", "x1": "radiology"}
    encoders = {e: {"domain": d, "method": "m", "method_group": "supervised"} for e, d in domains.items()}
    r_ref = pd.Series({"n1": 1.0, "n2": 2.0, "n3": 3.0, "c1": 4.0, "c2": 5.0, "x1": 6.0})
    r_cmp = pd.Series({"n1": 3.0, "n2": 4.0, "n3": 2.0, "c1": 1.0, "c2": 6.0, "x1": 5.0})
    dist = with_groups(distance_rows("finetune vs linear_aug", "protocols", "finetune", "linear_aug", r_ref, r_cmp,
                                     "positive = better relative rank under linear_aug than under finetune"),
                       encoders)
    kw = kruskal_table(dist)
    distance_bars(dist, kw, encoders, tmp_path / "srd.png", title="t")
    ax = captured[-1].axes[0]
    labels = [t.get_text().split(" (")[0] for t in ax.get_xticklabels()]
    assert labels == ["natural", "retinal", "other"]  # the paper's groups (cfp + oct: retinal), largest first
    heights = [p.get_height() for p in ax.patches]
    d = dist.set_index("encoder")["distance"]
    assert heights == pytest.approx([d[["n1", "n2", "n3"]].mean(), d[["c1", "c2"]].mean(), d["x1"]])
    points = sorted(y for c in ax.collections for _, y in c.get_offsets())
    assert points == pytest.approx(sorted(d.to_numpy()))  # every encoder overlaid
    assert d["n1"] == pytest.approx(-2 / math.sqrt(2))
    p = kw.set_index("group_by").loc["domain_group", "p"]
    assert f"Kruskal–Wallis across pretraining domain: p = {p:.3f}" in ax.get_title()
    assert "better relative rank under linear_aug" in ax.get_ylabel()


def test_lr_figures_are_by_model_size(study, captured, tmp_path):
    from matplotlib.colors import to_hex

    from retinabench.figures.style import SIZE_COLORS
    ctx, tables = study
    outputs = analysis_outputs(ctx, str(tmp_path))
    run_family("ranks", tables, AnalysisContext.from_params(ctx.params_for("ranks")), outputs["ranks"])
    tables = tables | {"ranks": pd.read_parquet(outputs["ranks"]["ranks"])}
    run_family("sensitivity", tables, AnalysisContext.from_params(ctx.params_for("sensitivity")),
               outputs["sensitivity"])
    sens_fig, srd_fig = captured[-2:]
    sizes = {e: m["size_class"] for e, m in ctx.encoders.items()}
    ax = sens_fig.axes[0]
    order = [t.get_text() for t in ax.get_yticklabels()]
    assert [to_hex(p.get_facecolor()) for p in ax.patches] == [SIZE_COLORS[sizes[e]].lower() for e in order]
    srd = srd_fig.axes[0]
    groups = [t.get_text().split(" (")[0] for t in srd.get_xticklabels()]
    assert set(groups) == set(sizes.values()) and "model size" in srd.get_title()


@pytest.mark.slow
def test_paper_scale_figures_fit_the_print_targets(tmp_path):
    """34 encoders × 39 tasks (OcularBench's grid): labels, legends and pages still fit; lr transfer on 4 pages."""
    from retinabench.figures.style import recording
    encoders, tasks, datasets = synthetic_registries(34, 39, seed=0)
    metrics = synthetic_metrics(encoders, tasks, protocols=PROTOCOLS, seeds=(0,), regimes=("u-u", "b-b"),
                                metrics=("accuracy", "auroc"), splits=("test",), seed=0)
    grid, sensitivity = synthetic_sweep(encoders, ["task00", "task01"], seed=0)
    ctx = AnalysisContext(encoders=encoders, tasks=tasks, datasets=datasets, protocols=PROTOCOLS,
                          regimes=["u-u", "b-b"], ranking={"metric": "accuracy", "regime": "u-u"},
                          settings=ANALYSIS_DEFAULTS | {"alternative_metrics": []},
                          lr_source="sweep/lr_sensitivity.parquet", lr_grid="sweep/lr_sweep_metrics.parquet",
                          subgroup_source="reliability/subgroups.parquet",
                          sweep_tasks={"sweep": "task00", "check": "task01"})
    tables = {"metrics": metrics, "subgroups": synthetic_subgroups(metrics[metrics["protocol"] == "finetune"]),
              "lr_sweep": sensitivity, "lr_grid": grid, "baselines": synthetic_baselines(tasks)}
    with recording() as saved:
        outputs = run_all(ctx, tables, tmp_path)
    assert sum(k.startswith("png_part") for k in outputs["lr_transfer"]) == 3  # 34 encoders: 4 pages
    assert {s["path"]: s["problems"] for s in saved if s["problems"]} == {}
    assert all(s["width_mm"] <= 180.5 and s["height_mm"] <= 240.5 for s in saved)


def _hlines(ax) -> list[float]:
    """y of the horizontal full-width reference lines of a panel (axhline: x data from 0 to 1 in axes units)."""
    out = []
    for line in ax.lines:
        x, y = line.get_xdata(), line.get_ydata()
        if len(y) == 2 and y[0] == y[1] and list(x) == [0, 1]:
            out.append(float(y[0]))
    return out


def test_lr_transfer_panels_draw_each_tasks_majority_level(study, captured, tmp_path):
    """Baselines beside the headline numbers: the validation majority-class rate of the sweep task and of the
    check task is a reference line in every panel, and named in the legend."""
    from retinabench.stats.baselines import select
    ctx, tables = study
    outputs = analysis_outputs(ctx, str(tmp_path))
    run_family("lr_transfer", tables, AnalysisContext.from_params(ctx.params_for("lr_transfer")),
               outputs["lr_transfer"])
    base = select(tables["baselines"], "accuracy", "val", "u-u").set_index("task")["majority"]
    expected = sorted(100 * base[[ctx.sweep_tasks["sweep"], ctx.sweep_tasks["check"]]].to_numpy())
    fig = captured[-1]
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    assert panels
    for ax in panels:
        assert sorted(_hlines(ax)) == pytest.approx(expected), ax.get_title()
    assert "majority class (validation)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_transfer_and_auroc_subgroup_figures_draw_the_chance_level(monkeypatch, tmp_path):
    from retinabench.figures import reliability as rel
    figs = []
    monkeypatch.setattr(rel, "save", lambda fig, png: figs.append(fig) or [str(png)])
    monkeypatch.setattr(rel.plt, "close", lambda fig=None: None)
    encoders = {"e1": {"domain": "natural"}, "e2": {"domain": "cfp"}}
    rows = []
    for enc in encoders:
        for train, target in (("a", "a"), ("b", "a")):
            rows.append({"source": "transfer", "threshold": "none", "metric": "auroc", "regime": "u-u",
                         "protocol": "linear", "seed": 0, "encoder": enc, "train_task": train, "task": target,
                         "value": 0.8, "ci_low": 0.7, "ci_high": 0.9, "n": 40})
    rel.transfer_bars({"metrics": pd.DataFrame(rows)}, encoders, tmp_path, {"regime": "u-u", "protocol": "linear",
                                                                             "seed": 0}, groups={"g": ["a"]})
    assert figs and 0.5 in _hlines(figs[-1].axes[0])
    assert "chance (AUROC 0.5)" in [t.get_text() for t in figs[-1].legends[0].get_texts()]
    sub = []
    for enc in encoders:
        for group, v in (("female", 0.7), ("male", 0.8)):
            sub.append({"source": "frozen", "protocol": "linear", "regime": "u-u", "seed": 0, "threshold": "none",
                        "metric": "auroc", "dataset": "d", "task": "a", "train_task": "a", "encoder": enc,
                        "attribute": "sex", "group": group, "value": v, "ci_low": v - 0.1, "ci_high": v + 0.1,
                        "below_min_size": False, "reason": None, "n": 30})
    sel = {"source": "frozen", "protocol": "linear", "regime": "u-u", "seed": 0, "threshold": "none",
           "metric": "auroc"}
    paths, _ = rel.subgroup_scatter({"subgroups": pd.DataFrame(sub)}, encoders, tmp_path, sel)
    assert paths, "no subgroup scatter drawn"
    ax = figs[-1].axes[0]
    assert 0.5 in _hlines(ax)
    assert any(list(line.get_xdata()) == [0.5, 0.5] for line in ax.lines)  # the vertical chance line


def test_top_k_with_few_encoders_keeps_its_axis_labels_on_the_canvas(tmp_path):
    """Three narrow panels of two long-named encoders (the demo's shape): no label leaves the canvas."""
    from retinabench.figures.bars import top_k_panels
    from retinabench.figures.style import recording
    enc = {"efficientnet_lite0_in1k": {"domain": "natural"}, "vit_tiny_random": {"domain": "none"}}
    rows = [{"panel": panel, "encoder": e, "mean_rank": 1.2 + i * 0.6, "sd_rank": 0.4, "position": i + 1,
             "n_tasks": 3} for panel in ("all", "cfp", "oct") for i, e in enumerate(enc)]
    with recording() as saved:
        top_k_panels(pd.DataFrame(rows), enc, tmp_path / "top_k.png", titles={"all": "all tasks"},
                     title="Top-2 encoders by mean rank")
    assert saved and saved[0]["problems"] == []


def test_lr_transfer_of_a_sensitivity_subset_swept_balanced(study, captured, tmp_path):
    """OcularBench's sensitivity repeat: three encoders on the check task, in b-b. The transfer figure draws those
    three only, each task's majority level in its own regime (the balanced check task: 50 % of a binary task)."""
    from retinabench.stats.baselines import select
    ctx, tables = study
    checked = list(ctx.encoders)[:3]
    grid, sensitivity = synthetic_sweep(ctx.encoders, ["task00", "task01"], seed=1, check_encoders=checked,
                                        check_regime="b-b")
    sub = AnalysisContext(**{**ctx.__dict__, "sweep_tasks": {"sweep": "task00", "check": "task01",
                                                              "check_regime": "b-b", "check_encoders": checked}})
    outputs = analysis_outputs(sub, str(tmp_path))
    assert not any(k.startswith("png_part") for k in outputs["lr_transfer"])  # three encoders: one page
    run_family("lr_transfer", {**tables, "lr_sweep": sensitivity, "lr_grid": grid},
               AnalysisContext.from_params(sub.params_for("lr_transfer")), outputs["lr_transfer"])
    table = pd.read_csv(outputs["lr_transfer"]["table"])
    assert sorted(table["encoder"].unique()) == sorted(checked)
    assert table.groupby("role")["regime"].unique().map(list).to_dict() == {"sweep task": ["u-u"],
                                                                            "transfer check": ["b-b"]}
    levels = [select(tables["baselines"], "accuracy", "val", r).set_index("task")["majority"][t]
              for t, r in (("task00", "u-u"), ("task01", "b-b"))]
    fig = captured[-1]
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    assert len(panels) == 3 * 2  # three encoders x two stages
    for ax in panels:
        assert sorted(_hlines(ax)) == pytest.approx(sorted(100 * v for v in levels)), ax.get_title()
