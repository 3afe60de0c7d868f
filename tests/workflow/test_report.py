"""The analysis layer inside the workflow: the HTML report (every figure with its caption and section),
Snakemake's change detection for analysis rules, and a figure's provenance chain. Runs on the session's tiny
phantom workflow (tests/workflow/conftest.py); tests that change anything work on a copy."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from retinabench.schemas import read_table, write_table
from retinabench.analysis import AnalysisContext
from retinabench.plan.family_outputs import analysis_outputs
from retinabench.plan.selection import plan
from tests.workflow.conftest import run_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
REPORT_DIR = REPO / "workflow" / "report"
# Tables shown in the report, and the caption each uses (figures use the caption named like the figure).
TABLE_CAPTIONS = {"ranking_csv": "ranking_table", "appendix_csv": "appendix_table",
                  "attributes_csv": "attribute_distribution"}
SECTIONS = {"rank_distribution": "1. Ranking", "cd_diagram": "1. Ranking", "ranking_table": "1. Ranking",
            "appendix_table": "1. Ranking", "rank_distribution_linear_probe": "1. Ranking",
            "cd_diagram_linear_probe": "1. Ranking", "protocol_rank_heatmap": "2. Protocols",
            "spearman_protocols": "2. Protocols", "spearman_regimes": "2. Protocols", "srd_protocols": "2. Protocols",
            "protocol_rank_heatmap_extended": "2. Protocols", "spearman_protocols_extended": "2. Protocols",
            "srd_protocols_extended": "2. Protocols",
            "ft_lp_gap": "2. Protocols", "srd_subsets": "3. Subsets", "subset_ranks": "3. Subsets",
            "leakage_rank_change": "4. Leakage", "top_k": "4. Leakage", "top_k_oct": "4. Leakage",
            "attribute_distribution": "5. Fairness", "subgroup_accuracy": "5. Fairness",
            "lr_sensitivity": "6. Sensitivity", "srd_lr": "6. Sensitivity", "lr_transfer": "6. Sensitivity"}


def expected_report_files(workdir: Path) -> dict[str, str]:
    """{path in the report: caption name} for the analysis outputs this config produces."""
    config = run_config(workdir)
    p = plan(config)
    ctx = AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    alts = [m for m in ctx.metrics if m != ctx.metric]
    out = {}
    for family in analysis_outputs(ctx, "results").values():
        for key, path in family.items():
            if key.startswith("png"):
                stem = Path(path).stem
                for m in alts:
                    stem = stem.removesuffix(f"_{m}")
                out[path] = stem
            elif key in TABLE_CAPTIONS:
                out[path] = TABLE_CAPTIONS[key]
    return out


def report_json(html: str, var: str) -> dict:
    m = re.search(rf"var {var} = (\{{.*?\}});\s*\n", html, re.S)
    assert m, f"no `var {var}` in the report"
    return json.loads(m.group(1))


def job_counts(dry_run_stdout: str) -> dict[str, int]:
    if "Nothing to be done" in dry_run_stdout:
        return {}
    counts = {}
    for ln in dry_run_stdout.split("Job stats:")[1].splitlines()[3:]:
        if ln.split()[:1] == ["total"]:
            break
        name, n = ln.split()
        counts[name] = int(n)
    return counts


@pytest.fixture(scope="module")
def work_copy(tiny_workflow, tmp_path_factory):
    """A private copy of the finished tiny run (these tests rerun and edit things)."""
    work = tmp_path_factory.mktemp("analysis_wf") / "repo"
    shutil.copytree(tiny_workflow, work, symlinks=True)
    return work


# Captions of the other report entries: the baselines and skipped tables, and the reliability figures (one
# caption for the four reliability figure folders, chosen by the figure wildcard).
OTHER_CAPTIONS = {"baselines": "1. Ranking", "skipped_analyses": "0. Skipped analyses",
                  "reliability_figure": None, "protocol_sensitivity": "6. Sensitivity", "focus_figure": None,
                  "focus_table": None}


def test_every_caption_file_is_used_by_a_rule():
    from retinabench.analysis.context import FAMILIES  # the report entries analysis.smk's rules carry
    used = {r.caption for f in FAMILIES.values() for r in f.report}
    smk = "".join((REPO / f"workflow/rules/{f}.smk").read_text() for f in ("analysis", "reliability"))
    captions = sorted(p.stem for p in REPORT_DIR.glob("*.rst") if p.stem != "workflow")
    assert captions and set(captions) == used | set(OTHER_CAPTIONS), (captions, sorted(used))
    assert all(f"/{c}.rst" in smk for c in OTHER_CAPTIONS)  # the rules outside the analysis families
    assert set(captions) == set(SECTIONS) | set(OTHER_CAPTIONS)
    from retinabench.skipped import SECTIONS as PACKAGE_SECTIONS
    assert all(PACKAGE_SECTIONS[c] == s for c, s in SECTIONS.items())  # one home for the report's sections


@pytest.fixture(scope="module")
def report_html(work_copy, report_builder):
    report_builder(work_copy, "report.html")  # as `make report` builds it: retinabench report
    return work_copy / "report.html"


def test_report_holds_every_figure_with_its_caption(work_copy, report_html):
    html = report_html.read_text()
    results, categories = report_json(html, "results"), report_json(html, "categories")
    expected = expected_report_files(work_copy)
    assert {"results/figures/rank_distribution.png", "results/figures/srd_protocols.png"} <= set(expected)
    encoders = run_config(work_copy)["encoders"]
    for path, caption in expected.items():
        assert path in results, f"{path} missing from the report"
        first_line = (REPORT_DIR / f"{caption}.rst").read_text().splitlines()[0].strip()
        text = results[path]["caption"]
        assert first_line.replace("'", "&#x27;") in text or first_line in text, (path, first_line, text[:200])
        assert "Runs" in text and all(e in text for e in encoders), text
        assert "retinabench provenance" in text and f'<tt class="docutils literal">{path}</tt>' in text
        section = [c for c, subs in categories.items() for files in subs.values() if path in files]
        assert section == [SECTIONS[caption]], (path, section)
    assert all(not p.endswith(".pdf") for p in results)  # PDFs are files beside the PNGs, not report entries
    assert "retinabench: frozen-encoder benchmark" in html  # the workflow description
    # reliability figures: one entry per panel group, fairness ones in the fairness section, with a caption
    rel = {p: c for c, subs in categories.items() for files in subs.values() for p in files
           if "/figures/reliability/" in p}
    assert rel and all(p.endswith(".png") for p in rel)
    assert {c for p, c in rel.items() if "/fairness_gaps/" in p or "/subgroup_scatter/" in p} == {"5. Fairness"}
    assert {c for p, c in rel.items() if "/reliability_diagrams/" in p} == {"7. Reliability"}
    assert all("Selection" in results[p]["caption"] for p in rel)
    assert "results/skipped_analyses.csv" in categories["0. Skipped analyses"][next(iter(
        categories["0. Skipped analyses"]))]
    assert "results/analysis/baselines.csv" in categories["1. Ranking"]["Tables"]


def require_browser():
    from retinabench.report_check import BrowserMissing, find_browser
    try:
        find_browser()
    except BrowserMissing as err:
        if os.environ.get("CI"):
            pytest.fail(f"{err}; .ci/run installs them")
        pytest.skip(str(err))


def test_report_renders_every_section_in_a_browser(report_html, tmp_path):
    """The report as a collaborator opens it: headless Chromium, every section's figures decoded and shown."""
    from retinabench.report_check import check_report
    require_browser()
    html = report_html.read_text()
    categories, results = report_json(html, "categories"), report_json(html, "results")
    check = check_report(report_html, screenshots=tmp_path / "shots")
    assert check.ok, check.summary()
    assert set(check.sections) == set(categories)
    assert {"1. Ranking", "5. Fairness", "7. Reliability", "0. Skipped analyses"} <= set(check.sections)
    for section, items in check.sections.items():
        images = [i for i in items if i["mime"].startswith("image/")]
        assert all(i.get("width", 0) > 0 for i in images), (section, images)
        for i in images:  # the browser shows the PNG at its own size
            from PIL import Image
            assert (i["width"], i["height"]) == Image.open(report_html.parent / i["path"]).size, i
    assert sum(len(v) for v in check.sections.values()) == len(results)
    assert len(list((tmp_path / "shots").glob("*.png"))) == sum(
        i["mime"].startswith("image/") for v in check.sections.values() for i in v)


# Issue 23, fault 5 (tests/test_fault_injection.py holds its fast tests): a script in a registry's free text.
SCRIPT = "</script><script>document.title='pwned';window.pwned=1</script>"


def test_fault5_registry_text_cannot_script_the_report(work_copy, tmp_path, run_snakemake, report_builder):
    """The tiny run's report, rebuilt after its task registry's descriptions and notes (and its dataset registry's
    descriptions) became a script: a bare `snakemake --report` runs it (the fault); `retinabench report` escapes
    it, nothing runs, and the reader sees the text in the baselines' job parameters."""
    from selenium.webdriver.support.ui import WebDriverWait
    from retinabench.report_build import unescaped_inline_data
    from retinabench.report_check import _READY, open_report
    require_browser()
    work = edited_copy(work_copy, tmp_path)
    p = plan(run_config(work))
    for registry, names, fields in (("tasks", p.tasks, ("description", "note")), ("datasets", p.datasets,
                                                                                  ("description",))):
        path = work / f"config/{registry}.yaml"
        entries = yaml.safe_load(path.read_text())
        for name in names:
            entries[name].update(dict.fromkeys(fields, SCRIPT))
        path.write_text(yaml.safe_dump(entries))
    run_snakemake(work, "--report", "bare.html")  # the report is built from the registries as they are now
    report_builder(work, "report.html")
    bare, html = (work / "bare.html").read_text(), (work / "report.html").read_text()
    assert SCRIPT in bare and "results" in unescaped_inline_data(bare)  # the task entries are job parameters
    assert SCRIPT not in html and unescaped_inline_data(html) == []
    with open_report(work / "bare.html") as browser:  # the fault: the description runs as script
        WebDriverWait(browser, 30).until(lambda d: d.title == "pwned")
        assert browser.execute_script("return window.pwned") == 1
    baselines = "results/analysis/baselines.csv"
    with open_report(work / "report.html") as browser:
        WebDriverWait(browser, 60).until(lambda d: d.execute_script(_READY))
        browser.execute_script("app.showResultInfo(arguments[0]);", baselines)
        WebDriverWait(browser, 30).until(lambda d: "job parameters" in d.find_element("id", "app").text.lower())
        shown = browser.find_element("id", "app").text  # the text a reader sees
        assert shown.count(SCRIPT) == 2 * len(p.tasks), shown[-3000:]  # each task's description and note, as written
        assert browser.title == "Snakemake Report" and browser.execute_script("return window.pwned") is None
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]  # the report's data loaded


def test_finished_run_plans_nothing(work_copy, run_snakemake):
    assert job_counts(run_snakemake(work_copy, "-n").stdout) == {}


def analysis_rules(workdir: Path, reading=("metrics", "ranks")) -> set[str]:
    """Rules of the analysis families this config produces that read one of ``reading`` (the fairness family
    reads the reliability layer's subgroup table instead)."""
    from retinabench.analysis import FAMILIES
    config = run_config(workdir)
    p = plan(config)
    ctx = AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    return {FAMILIES[f].rule for f in analysis_outputs(ctx, "results") if set(FAMILIES[f].inputs) & set(reading)}


def edited_copy(work_copy: Path, dest: Path, analysis_change: dict | None = None) -> Path:
    work = dest / "repo"
    shutil.copytree(work_copy, work, symlinks=True)
    if analysis_change:
        tiny = yaml.safe_load((work / "config/tiny.yaml").read_text())
        base = yaml.safe_load((work / "config/config.yaml").read_text())["analysis"]
        tiny["analysis"] = {**base, **analysis_change}
        (work / "config/tiny.yaml").write_text(yaml.safe_dump(tiny))
    return work


def test_changing_the_metrics_table_reruns_exactly_the_analysis(work_copy, tmp_path, run_snakemake):
    work = edited_copy(work_copy, tmp_path)
    path = work / "results/metrics.parquet"
    metrics = read_table(path, "metrics")
    metrics.loc[0, "value"] = metrics.loc[0, "value"] * 0.5  # new content (a bare touch with the same bytes is
    write_table(metrics, path, "metrics")                     # recognised by Snakemake's checksums: no rerun)
    now = time.time() + 5
    os.utime(path, (now, now))
    jobs = job_counts(run_snakemake(work, "-n").stdout)
    assert set(jobs) == analysis_rules(work) | {"all"}, jobs
    assert all(n == 1 for n in jobs.values())  # one job per figure family, never one per task


def test_changing_a_ranking_metric_reruns_the_analysis_only(work_copy, tmp_path, run_snakemake):
    work = edited_copy(work_copy, tmp_path, {"alternative_metrics": ["auroc"]})
    jobs = job_counts(run_snakemake(work, "-n").stdout)
    assert set(jobs) == analysis_rules(work) | {"all"}, jobs  # ranks.parquet changes: all its readers rerun


@pytest.mark.parametrize("change, expected", [
    ({"alpha": 0.1}, {"signed_rank_distance"}),  # Kruskal-Wallis significance (2 encoders: no CD, no Spearman)
    ({"top_k": 2}, {"top_k"}),
])
def test_an_analysis_setting_reruns_only_its_dependants(work_copy, tmp_path, run_snakemake, change, expected):
    assert len(run_config(work_copy)["encoders"]) == 2, "expectations below are for the 2-encoder tiny run"
    work = edited_copy(work_copy, tmp_path, change)
    jobs = job_counts(run_snakemake(work, "-n").stdout)
    assert set(jobs) == expected | {"all"}, jobs


def test_figure_provenance_reaches_predictions_splits_weights_and_commit(work_copy):
    cli = [sys.executable, "-m", "retinabench", "provenance", "results/figures/srd_protocols.png"]
    out = subprocess.run(cli, cwd=work_copy, capture_output=True, text=True, check=True).stdout
    config = run_config(work_copy)
    p = plan(config)
    for enc in p.encoders:
        for task in p.tasks:
            assert f"results/predictions/frozen/{enc}/{task}.parquet" in out, (enc, task)
    for task in p.tasks:
        assert f"/{task}.parquet  <- rule task_split" in out, task
    for dataset in p.datasets:  # every task view comes from its dataset's one assignment
        assert f"results/splits/{dataset}.parquet  <- rule split" in out, dataset
    for needle in ("rule signed_rank_distance", "rule ranks", "rule collect_metrics", "rule frozen",
                   "rule features", "weights:", "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
                   "none (random init)"):
        assert needle in out, f"{needle!r} missing:\n{out}"
    assert "no-commit" not in out.splitlines()[0]  # the code commit is recorded
    side = json.loads(subprocess.run([*cli, "--json"], cwd=work_copy, capture_output=True, text=True,
                                     check=True).stdout)
    assert side["config"]["settings"]["alpha"] == 0.05 and side["config"]["ranking"]["metric"] == "accuracy"
    assert side["inputs"][0]["path"] == "results/analysis/ranks.parquet"
