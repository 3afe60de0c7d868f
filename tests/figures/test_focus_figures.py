"""FOCUS's figures drawn from the synthetic reliability tables, and the focus_tables / focus_figure stages end to
end on files (outputs and sidecars)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from retinabench.figures import focus as figs
from retinabench.pipeline import Job, run_stage
from retinabench.reliability import focus_tables as ft
from retinabench.testing.focus import ENCODERS, TASKS, focus_comparisons, focus_tables

# figure -> the titled panels it must have
PANELS = {"spiders": {"VM", "VLM", "MLLM"}, "auroc_ece": {""}, "mllm_size": {""}, "probe_vs_zeroshot": {"any_dr"},
          "dataset_heatmap": {"VM", "VLM", "MLLM"}, "calibration_curves": {"general VM", "ophthalmic VM"},
          "sft_deltas": {"all adapters", "per MLLM", "per training task (AUROC)"}}


def _bins():
    return pd.DataFrame([{"source": "frozen", "encoder": e, "protocol": "logreg", "train_task": t, "task": t,
                          "regime": "u-u", "calibration": "before", "bin": b, "n": 5, "mean_prob": b / 10 + 0.05,
                          "observed": b / 10} for e in ("gen_vm", "oph_vm") for t in TASKS for b in range(10)])


@pytest.fixture(scope="module")
def rows():
    m, g = focus_tables()
    r = ft.focus_rows(m, g, TASKS, regime="u-u", fairness_attributes=["sex", "age_median"])
    return ft.with_groups(r, ft.model_groups(ENCODERS))


@pytest.mark.parametrize("name", sorted(figs.FIGURES))
def test_each_figure_draws_its_panels(name, rows, tmp_path, monkeypatch):
    seen = {}
    real_save = figs.save

    def spy(fig, png, **kw):
        seen["titles"] = {ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"}
        return real_save(fig, png, **kw)
    monkeypatch.setattr(figs, "save", spy)
    data = ft.figure_data(name, rows, bins=_bins(), comparisons=focus_comparisons())
    paths = figs.FIGURES[name](data, tmp_path / f"{name}.png")
    assert [Path(p).suffix for p in paths] == [".png", ".pdf"] and all(Path(p).stat().st_size > 0 for p in paths)
    assert PANELS[name] <= seen["titles"]


def test_stages_write_tables_figures_and_sidecars(tmp_path):
    m, g = focus_tables()
    paths = {"metrics": tmp_path / "metrics.parquet", "gaps": tmp_path / "gaps.parquet",
             "comparisons": tmp_path / "comparisons.parquet", "bins": tmp_path / "bins.parquet"}
    m.to_parquet(paths["metrics"]), g.to_parquet(paths["gaps"])
    focus_comparisons().to_parquet(paths["comparisons"]), _bins().to_parquet(paths["bins"])
    params = {"tasks": TASKS, "encoders": ENCODERS, "regime": "u-u", "fairness_attributes": ["sex", "age_median"],
              "variant": "invalid_wrong"}
    out = {f"{t}_{e}": str(tmp_path / f"{t}.{e}") for t in ("table3", "table4", "table10") for e in ("csv", "tex")}
    run_stage("focus_tables", Job(rule="focus_tables", input={"metrics": str(paths["metrics"]), "gaps": str(paths["gaps"]),
                                              "comparisons": [str(paths["comparisons"])]},
                  output=out, params=params))
    for p in out.values():
        assert Path(p).is_file() and Path(p + ".prov.json").is_file()
    side = json.loads(Path(out["table3_csv"] + ".prov.json").read_text())
    assert "shift" in json.dumps(side)
    t3 = pd.read_csv(out["table3_csv"])
    assert {"fairness", "quality", "shift"} <= set(t3.columns)
    assert "\\toprule" in Path(out["table10_tex"]).read_text()
    fig_out = {"png": str(tmp_path / "calibration_curves.png"), "pdf": str(tmp_path / "calibration_curves.pdf")}
    run_stage("focus_figure", Job(rule="focus_figure", input={"metrics": str(paths["metrics"]), "gaps": str(paths["gaps"]),
                                              "bins": str(paths["bins"])},
                  output=fig_out, params=params, wildcards={"figure": "calibration_curves"}))
    assert all(Path(p).is_file() and Path(p + ".prov.json").is_file() for p in fig_out.values())
