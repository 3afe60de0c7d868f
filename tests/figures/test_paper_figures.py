"""Figure rules of the paper's figures: points instead of violins under 5 ranks, paper protocols vs the extended
twins, titles that name a fallback protocol once."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retinabench.analysis import AnalysisContext
from retinabench.analysis.families import run_family
from retinabench.plan.family_outputs import analysis_outputs
from retinabench.settings import AnalysisSettings
from retinabench.stats.ranks import rank_tables
from retinabench.testing.synthetic import synthetic_baselines, synthetic_metrics, synthetic_registries

ANALYSIS_DEFAULTS = AnalysisSettings().plain()


def _ranks(n_tasks: int, protocols=("linear",)) -> tuple[dict, pd.DataFrame]:
    encoders, tasks, _ = synthetic_registries(4, n_tasks, seed=3)
    metrics = synthetic_metrics(encoders, tasks, protocols=protocols, seeds=(0,), regimes=("u-u",),
                                metrics=("accuracy",), splits=("test",), seed=3)
    return encoders, rank_tables(metrics, ["accuracy"])


@pytest.mark.parametrize("n_tasks, violins", [(2, False), (4, False), (5, True), (8, True)])
def test_rank_figure_draws_points_below_five_ranks_per_encoder(monkeypatch, tmp_path, n_tasks, violins):
    from matplotlib.axes import Axes

    from retinabench.figures import ranks as rank_fig
    drawn, titles = [], []
    real = Axes.violinplot
    monkeypatch.setattr(Axes, "violinplot", lambda self, *a, **k: drawn.append(a) or real(self, *a, **k))
    monkeypatch.setattr(rank_fig, "save", lambda fig, png: titles.extend(ax.get_title() for ax in fig.axes)
                        or [str(png)])
    encoders, ranks = _ranks(n_tasks)
    rank_fig.rank_distribution_figure(ranks, encoders, tmp_path / "r.png", metric="accuracy")
    assert bool(drawn) is violins
    assert ("points: under 5 ranks per encoder" in titles[0]) is (not violins)
    assert rank_fig.draws_violins([np.arange(5)] * 3) and not rank_fig.draws_violins([np.arange(5), np.arange(4)])


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory):
    """Every family of a run without fine-tuning (the analysis protocol falls back to `linear`), figures kept."""
    from retinabench.figures import agreement, bars, cd, ranks, scatter
    encoders, tasks, datasets = synthetic_registries(5, 6, seed=1)
    metrics = synthetic_metrics(encoders, tasks, protocols=["knn", "linear", "logreg"], seeds=(0,),
                                regimes=("u-u",), seed=1)
    params = {"encoders": encoders, "tasks": tasks, "datasets": datasets, "protocols": ["knn", "linear", "logreg"],
              "regimes": ["u-u"], "ranking": {"metric": "accuracy", "regime": "u-u"},
              "headline": {"protocol": "linear", "role": "fallback", "note": "fallback: finetune not run"},
              "settings": ANALYSIS_DEFAULTS}
    ctx = AnalysisContext.from_params(params)
    root = tmp_path_factory.mktemp("fallback")
    out = analysis_outputs(ctx, str(root))
    texts: dict[str, list[str]] = {}
    mp = pytest.MonkeyPatch()
    for module in (agreement, bars, cd, ranks, scatter):
        real = module.save

        def keep(fig, png, real=real, **kw):
            from retinabench.figures.style import _drawn_texts
            texts[Path(png).name] = [t.get_text() for t in _drawn_texts(fig)]
            return real(fig, png, **kw)
        mp.setattr(module, "save", keep)
    tables = {"metrics": metrics, "baselines": synthetic_baselines(tasks)}
    try:
        for family, paths in out.items():
            if family in ("fairness", "attributes"):
                continue
            if family != "ranks":
                tables.setdefault("ranks", pd.read_parquet(out["ranks"]["ranks"]))
            run_family(family, tables, AnalysisContext.from_params(ctx.params_for(family)), paths)
    finally:
        mp.undo()
    return ctx, out, texts


def test_a_fallback_protocol_is_named_once_per_figure(fallback_run):
    _, _, texts = fallback_run
    assert texts and any("fallback" in t for ts in texts.values() for t in ts)
    assert {name: n for name, ts in texts.items() if (n := sum(t.count("fallback") for t in ts)) > 1} == {}


def test_without_the_papers_protocols_the_protocol_figures_show_every_ranked_protocol(fallback_run):
    ctx, out, _ = fallback_run
    # knn is the only paper protocol ranked: no paper-only figure to make, no extended twin, no Fig. 4 / A.3
    assert ctx.protocol_sets == {"": ["knn", "linear", "logreg"]}
    assert "png_extended" not in out["protocol_heatmap"] and "png_linear_probe" not in out["cd"]


def test_paper_protocol_figures_leave_the_projects_extra_probes_to_the_extended_twin(tmp_path):
    from retinabench.figures import agreement
    encoders, tasks, datasets = synthetic_registries(5, 6, seed=2)
    protocols = ["knn", "linear", "linear_aug", "finetune"]
    metrics = synthetic_metrics(encoders, tasks, protocols=protocols, seeds=(0,), regimes=("u-u", "b-b"), seed=2)
    ctx = AnalysisContext(encoders=encoders, tasks=tasks, datasets=datasets, protocols=protocols,
                          regimes=["u-u", "b-b"], ranking={"metric": "accuracy", "regime": "u-u"},
                          settings=ANALYSIS_DEFAULTS | {"alternative_metrics": []})
    out = analysis_outputs(ctx, str(tmp_path))
    assert ctx.protocol_sets == {"": ["knn", "linear_aug", "finetune"], "_extended": protocols}
    run_family("ranks", {"metrics": metrics}, AnalysisContext.from_params(ctx.params_for("ranks")), out["ranks"])
    ranks = pd.read_parquet(out["ranks"]["ranks"])
    columns: dict[str, list[str]] = {}
    real = agreement.heatmap_panels

    def spy(panels, *a, **k):
        columns[Path(a[1]).name] = sorted({c for m in panels.values() for c in m.columns})
        return real(panels, *a, **k)
    mp = pytest.MonkeyPatch()
    mp.setattr(agreement, "heatmap_panels", spy)
    try:
        run_family("protocol_heatmap", {"ranks": ranks}, AnalysisContext.from_params(ctx.params_for("protocol_heatmap")),
                   out["protocol_heatmap"])
    finally:
        mp.undo()
    assert columns == {"protocol_rank_heatmap.png": ["finetune", "knn", "linear_aug"],
                       "protocol_rank_heatmap_extended.png": sorted(protocols)}
    for key in ("png", "png_extended", "pdf", "pdf_extended"):
        assert Path(out["protocol_heatmap"][key]).is_file()
