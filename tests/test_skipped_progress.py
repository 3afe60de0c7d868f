"""The skipped-analyses table (retinabench.skipped), progress lines (retinabench.progress) and the [done] line
run_stage ends every job's log with (retinabench.pipeline.job)."""
import io

import pandas as pd

from retinabench import skipped
from retinabench.progress import Progress, progress
from retinabench.analysis import AnalysisContext
from retinabench.plan.family_outputs import analysis_outputs


def test_planning_records_every_figure_it_leaves_out():
    ctx = AnalysisContext(encoders={"a": {"domain": "natural", "exposure": []}, "b": {"domain": "cfp", "exposure": []}},
                          tasks={"t1": {"dataset": "d", "modality": "cfp", "family": "glaucoma"}},
                          datasets={"d": {"web_exposure_risk": "low"}}, protocols=["linear"], regimes=["u-u"],
                          ranking={"metric": "accuracy", "regime": "u-u"}, subgroup_source="s.parquet")
    rows = []
    out = analysis_outputs(ctx, "R", rows)
    reasons = {r["output"]: r["reason"] for r in rows}
    assert "cd" not in out and "2 encoder(s) and 1 task(s)" in reasons["cd_diagram"]
    assert "3 encoders; this run has 2" in reasons["spearman_protocols"]
    assert "finetune" in reasons["ft_lp_gap"] and "sweep" in reasons["lr_transfer"]
    assert {r["section"] for r in rows} >= {"1. Ranking", "2. Protocols", "6. Sensitivity"}
    produced = [k for k in out]  # every planned output has no skip record, every skipped output has no path
    assert not {"cd", "agreement", "ft_lp", "sensitivity", "lr_transfer"} & set(produced)


def test_collect_merges_figures_coverage_and_missing_sections(tmp_path):
    fig = tmp_path / "fairness_gaps/skipped.csv"
    skipped.write([skipped.record("fairness_gaps", "no quality values", part="quality / ds2", n=4,
                                  source="figure")], fig)
    cov = pd.DataFrame([{"source": "frozen", "encoder": "e", "protocol": "linear", "dataset": "ds2", "task": "t",
                         "regime": "u-u", "scope": "attribute:quality", "status": "skipped", "n_rows": 10,
                         "reason": "no quality values in these rows"}] * 3)
    cov.to_parquet(tmp_path / "coverage.parquet")
    table = skipped.collect([skipped.record("cd_diagram", "needs >= 3 encoders")], {"fairness_gaps": str(fig)},
                            coverage=str(tmp_path / "coverage.parquet"),
                            produced=["rank_distribution", "fairness_gaps", "reliability_diagrams"])
    assert list(table.columns) == skipped.COLUMNS
    assert table.iloc[0]["output"] == "cd_diagram"  # section order: 1. Ranking first
    rel = table[table["source"] == "reliability"].iloc[0]
    assert rel["part"] == "quality / ds2" and rel["n"] == 3 and rel["section"] == "5. Fairness"
    missing = set(table.loc[table["output"] == "(whole section)", "section"])
    assert missing == {"2. Protocols", "3. Subsets", "4. Leakage", "6. Sensitivity"}
    path = tmp_path / "skipped_analyses.csv"
    table.to_csv(path, index=False)
    buf = io.StringIO()
    skipped.print_table(path, file=buf)
    text = buf.getvalue()
    assert text.startswith(f"Skipped analyses ({len(table)})") and "needs >= 3 encoders" in text
    assert str(path) in text
    buf = io.StringIO()
    skipped.print_table(tmp_path / "absent.csv", file=buf)
    assert "not written" in buf.getvalue()


def test_progress_prints_counts_eta_and_a_last_line():
    t = [0.0]
    buf = io.StringIO()
    bar = Progress(20, "frozen probes e/t", unit="fits", every_frac=0.25, every_s=1e9, file=buf, clock=lambda: t[0])
    for i in range(20):
        t[0] += 2.0
        bar.update(note=f"fit {i}")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[progress] frozen probes e/t: 1/20 fits (5%), 0:00:02 elapsed, ETA 0:00:38 (fit 0)"
    assert lines[-1].startswith("[progress] frozen probes e/t: 20/20 fits (100%), 0:00:40 elapsed, ETA 0:00:00")
    assert 4 <= len(lines) <= 7  # first, every quarter, last: a trail, not a line per item
    buf = io.StringIO()
    assert list(progress(iter("abc"), "letters", file=buf)) == ["a", "b", "c"]  # no len(): counts only
    assert "letters: 1 items" in buf.getvalue()


def test_a_job_summary_names_rows_pixels_files_and_time(tmp_path):
    from PIL import Image

    from retinabench.pipeline.job import SUMMARY_PREFIX, describe_output, job_summary
    pd.DataFrame({"a": range(7)}).to_parquet(tmp_path / "t.parquet")
    pd.DataFrame({"a": range(3)}).to_csv(tmp_path / "t.csv", index=False)
    Image.new("RGB", (40, 30)).save(tmp_path / "f.png")
    (tmp_path / "d").mkdir()
    for name in ("x.png", "x.png.prov.json", "y.csv"):
        (tmp_path / "d" / name).write_text("")
    (tmp_path / "model.pt").write_bytes(b"\0" * 11)
    assert describe_output(tmp_path / "t.parquet").endswith("(7 rows)")
    assert describe_output(tmp_path / "t.csv").endswith("(3 rows)")
    assert describe_output(tmp_path / "f.png").endswith("(40x30 px)")
    assert describe_output(tmp_path / "d").endswith("/ (2 files)")  # sidecars are not counted
    assert describe_output(tmp_path / "model.pt").endswith("(11 bytes)")
    assert describe_output(tmp_path / "absent.parquet").endswith("(not written)")
    outs = [tmp_path / n for n in ("t.parquet", "t.csv", "f.png", "d", "model.pt", "t.parquet", "t.csv", "f.png")]
    line = job_summary("frozen", {"encoder": "e", "task": "t"}, outs, 75.2)
    assert line.startswith(f"{SUMMARY_PREFIX} frozen (encoder=e, task=t): wrote 8 output(s): ")
    assert "(7 rows)" in line and "2 more" in line and line.endswith("in 0:01:15 (75.2 s)")
    assert "\n" not in line


def test_run_stage_ends_the_log_with_the_summary(tmp_path, capsys):
    from retinabench.pipeline import STAGES, Job, run_stage

    def stage(job):
        pd.DataFrame({"x": [1, 2]}).to_parquet(job.output["table"])
        print("working")
    STAGES.add("_test_summary", stage)
    try:
        run_stage("_test_summary", Job(rule="demo", input={}, output={"table": str(tmp_path / "o.parquet")},
                                       wildcards={"dataset": "d"}))
    finally:
        del STAGES._stages["_test_summary"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("[done] demo (dataset=d): wrote 1 output(s): ") and "o.parquet (2 rows)" in last


def test_opt_in_layers_left_off_are_listed_with_how_to_turn_them_on():
    from retinabench.settings import Config
    rows = skipped.optional_layers(Config().plain())  # every opt-in layer off by default
    assert [r["output"] for r in rows] == ["saliency", "compute", "lora_table5"]
    assert [r["section"] for r in rows] == [skipped.SALIENCY_COMPUTE] * 2 + [skipped.LORA]
    assert "saliency.enabled: true" in rows[0]["reason"] and "compute.enabled: true" in rows[1]["reason"]
    assert "lora.enabled: true" in rows[2]["reason"]
    assert skipped.optional_layers({"saliency": {"enabled": True}, "compute": {"enabled": True},
                                    "lora": {"enabled": True}}) == []
    rows = rows[:2]
    table = skipped.collect(rows + [skipped.record("cd_diagram", "needs >= 3 encoders")], {},
                            produced=["rank_distribution"])
    assert table["output"].iloc[0] == "cd_diagram"  # report sections first, then the opt-in layers
    assert table[table["output"].isin(["saliency", "compute"])].index.min() > table[
        table["section"] == skipped.RELIABILITY].index.max()
