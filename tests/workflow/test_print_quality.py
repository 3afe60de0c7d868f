"""What a researcher looks at, on the session's tiny workflow run (tests/workflow/conftest.py): figures at print
size with no clipped text, baselines beside the headline numbers, the skipped-analyses table, progress in the
job logs. The other runs' figure types (transfer, fine-tuning) are checked in their own modules."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from retinabench.figures.style import MAX_HEIGHT_MM, MM_PER_INCH, PNG_DPI, WIDTH_MM
from retinabench.schemas import read_table

pytestmark = pytest.mark.slow

# Figure types of the tiny run (2 encoders, 1 dataset: no CD / Spearman / transfer / fine-tuning figures).
TINY_TYPES = {"rank_distribution", "protocol_rank_heatmap", "srd_protocols", "srd_subsets", "subset_ranks", "top_k",
              "subgroup_accuracy", "reliability_diagrams", "fairness_gaps", "subgroup_scatter"}


def test_every_figure_type_is_drawn_within_the_print_targets(tiny_workflow, tmp_path, figure_checks):
    render, check = figure_checks
    saved = render(tiny_workflow, tmp_path)
    check(saved, TINY_TYPES)


def test_the_runs_figures_are_page_sized_files(tiny_workflow):
    figures = sorted((tiny_workflow / "results/figures").rglob("*.png"))
    assert figures
    max_w = round(WIDTH_MM["double"] / MM_PER_INCH * PNG_DPI) + 1
    max_h = round(MAX_HEIGHT_MM / MM_PER_INCH * PNG_DPI) + 1
    for f in figures:
        w, h = Image.open(f).size
        assert w <= max_w and h <= max_h, (f, w, h)
        assert f.with_suffix(".pdf").is_file(), f
    # reliability figures are folders of panel groups: one file per dataset / attribute, never one sheet
    rel = tiny_workflow / "results/figures/reliability"
    assert sorted(p.stem for p in (rel / "reliability_diagrams").glob("*.png")) == ["phantom"]
    gaps = sorted(p.stem for p in (rel / "fairness_gaps").glob("*.png"))
    skipped = pd.read_csv(rel / "fairness_gaps/skipped.csv")
    assert list(skipped.columns) == ["section", "output", "part", "reason", "n", "source"]
    # one file per attribute with a gap; every other attribute is a "no panel" row of skipped.csv (no empty panels)
    attributes = set(pd.read_parquet(tiny_workflow / "results/reliability/gaps.parquet")["attribute"])
    no_panel = set(skipped.loc[skipped["reason"].str.startswith("no panel"), "part"])
    assert gaps and not set(gaps) & no_panel, (gaps, no_panel)
    assert set(gaps) | no_panel == attributes, (gaps, no_panel, attributes)


def test_reliability_diagrams_keep_the_ece_out_of_the_data(tiny_workflow, monkeypatch, tmp_path):
    from retinabench.figures import reliability as rel
    from retinabench.settings import ReliabilitySettings
    figs = []
    monkeypatch.setattr(rel, "save", lambda fig, png: figs.append(fig) or [str(png)])
    monkeypatch.setattr(rel.plt, "close", lambda fig=None: None)
    tables = {k: pd.read_parquet(tiny_workflow / f"results/reliability/{k}.parquet") for k in ("bins", "calibration")}
    sel = {**ReliabilitySettings().figures.plain(), "protocol": "linear"}
    rel.reliability_diagrams(tables, {}, tmp_path, sel)
    assert figs
    for ax in figs[0].axes:
        assert not [t.get_text() for t in ax.texts if "ece" in t.get_text()]  # nothing drawn over the curve
        if ax.get_visible() and ax.lines:
            assert "ece" in ax.get_title()  # the ECE before -> after is in the panel title


def test_baselines_beside_the_headline_numbers(tiny_workflow):
    r = tiny_workflow / "results"
    base = pd.read_csv(r / "analysis/baselines.csv", keep_default_na=False, na_values={"majority": [""],
                                                                                   "chance": [""]})
    acc = base[(base["metric"] == "accuracy") & (base["split"] == "test") & (base["regime"] == "u-u")]
    for task, row in acc.set_index("task").iterrows():
        split = read_table(r / f"splits/phantom/{task}.parquet", "split")
        test = split[split["split"] == "test"]
        assert row["n"] == len(test)
        # the constant predictor of the training rows' most frequent class (no test labels used), scored on test
        train = split[split["split"] == "train"]
        assert row["majority_class"] == train["label"].value_counts().sort_index().idxmax()
        assert row["majority"] == pytest.approx((test["label"] == row["majority_class"]).mean())
        assert row["chance"] == pytest.approx(1 / row["n_classes"])
    au = base[base["metric"] == "auroc"]
    assert np.allclose(au["majority"], 0.5) and np.allclose(au["chance"], 0.5)
    app = pd.read_csv(r / "tables/appendix.csv")
    assert {"majority", "chance", "not_above_majority", "n", "baseline_n"} <= set(app.columns)
    assert (app["n"] == app["baseline_n"]).all()  # the baseline is computed on the rows each score was
    flagged = app[app["not_above_majority"]]
    assert (flagged["mean"] <= flagged["majority"] + 0.5 / flagged["n"] + 1e-6).all()  # 1e-6: the CSV keeps 6 decimals
    tex = (r / "tables/appendix.tex").read_text()
    assert r"\textit{majority class}" in tex and r"\textit{chance}" in tex
    assert (r"$^\dagger$" in tex) == bool(app.loc[app["regime"] == "u-u", "not_above_majority"].any())
    rank = pd.read_csv(r / "tables/ranking.csv")
    assert {"mean_majority", "mean_chance", "n_tasks_not_above_majority"} <= set(rank.columns)
    assert "Majority-class predictor" in (r / "tables/ranking.tex").read_text()


def test_the_skipped_table_says_what_was_not_produced_and_why(tiny_workflow):
    table = pd.read_csv(tiny_workflow / "results/skipped_analyses.csv")
    by_output = table.groupby("output")["reason"].first()
    assert "3 encoders" in by_output["cd_diagram"] and "2 encoder(s)" in by_output["cd_diagram"]
    assert "3 encoders" in by_output["spearman_protocols"]
    assert "finetune" in by_output["ft_lp_gap"]
    assert "second dataset" in by_output["transfer"]
    assert "saliency.enabled: true" in by_output["saliency"] and "compute.enabled" in by_output["compute"]
    assert set(table.loc[table["output"] == "(whole section)", "section"]) >= {"6. Sensitivity"}
    assert (table["reason"].str.len() > 0).all()
    stderr = (tiny_workflow / "run.log").read_text()
    assert "Skipped analyses (" in stderr and "cd_diagram" in stderr  # printed when the run ended


def test_long_jobs_log_progress_and_no_empty_shell_commands(tiny_workflow):
    logs = tiny_workflow / "results/logs"
    for pattern, needle in (("frozen/*/*.log", "[progress] frozen probes"), ("reliability/frozen/*/*.log",
                                                                             "[progress] reliability frozen"),
                            ("analysis/cd.log", None), ("analysis/distance.log", "[progress] analysis distance"),
                            ("manifest/*.log", "[progress] manifest")):
        files = sorted(logs.glob(pattern))
        if needle is None:
            assert not files  # two encoders: no Friedman job
            continue
        assert files, pattern
        for f in files:
            text = f.read_text()
            assert needle in text and "ETA" in text, (f, text[-500:])
    assert "Shell command: None" not in (tiny_workflow / "run.log").read_text()
    # every job's log ends with its one-line summary (what was written, how much, how long): none is empty
    all_logs = sorted(logs.rglob("*.log"))
    assert len(all_logs) >= 20, all_logs
    for f in all_logs:
        lines = f.read_text().strip().splitlines()
        assert lines and lines[-1].startswith("[done] "), (f, lines[-3:])
        assert " output(s): " in lines[-1] and lines[-1].endswith(" s)"), (f, lines[-1])
    split_log = next(logs.glob("split/*.log")).read_text()
    assert "rows)" in split_log.strip().splitlines()[-1]  # the split job names its rows
