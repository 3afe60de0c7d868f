"""Stages of workflow/rules/reliability.smk: transfer, per-table evaluation, collection, paired comparisons,
figures (retinabench.reliability does the work; docs/reliability.md)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from retinabench.pipeline.job import write_artifact, write_outputs
from retinabench.pipeline.stages import stage
from retinabench.reliability import (KINDS, analysis_subgroup_metrics, evaluate_predictions, harmonised_coverage,
                                     paired_comparisons, prepare_predictions, summary_scores)
from retinabench.settings.reliability import ReliabilitySettings


def _read_many(paths, kind) -> pd.DataFrame:
    from retinabench.schemas import read_table
    paths = [paths] if isinstance(paths, str) else list(paths)
    return pd.concat([read_table(p, kind) for p in paths], ignore_index=True)


@stage("transfer")
def stage_transfer(job) -> None:
    import time

    import torch

    from retinabench.features.extract import load_features
    from retinabench.protocols.transfer import run_transfer
    from retinabench.schemas import read_table
    torch.set_num_threads(max(1, job.threads))
    tasks, p = job.params["tasks"], job.params["transfer"]
    features = {}
    for path in job.input["features"]:
        features[Path(path).stem] = load_features(path)
    splits = {Path(s).stem: read_table(s, "split") for s in job.input["splits"]}
    t0 = time.perf_counter()
    preds = run_transfer(tasks, features, splits, job.wildcards["encoder"], protocols=p["protocols"], seeds=p["seeds"],
                         regimes=p["regimes"], cfg=job.params["probes"])
    write_artifact(preds, job.output["predictions"], "predictions")
    write_outputs(job, written=[job.output["predictions"]], config={"tasks": tasks, "transfer": p, "probes": job.params["probes"]},
              seed=p["seeds"], extra={"seconds": round(time.perf_counter() - t0, 2),
                                      "pairs": [f"{s['name']} -> {t['name']}" for s in tasks for t in tasks]})


@stage("reliability")
def stage_reliability(job) -> None:
    from retinabench.schemas import read_table
    p, tasks = job.params["reliability"], job.params["tasks"]
    settings = ReliabilitySettings.of(p)
    preds = read_table(job.input["predictions"], "predictions")
    manifest = _read_many(job.input["manifests"], "manifest")
    exclusions = _read_many(job.input["exclusions"], "exclusions")
    splits = {Path(s).stem: read_table(s, "split") for s in job.input["splits"]}
    tables = evaluate_predictions(preds, manifest, exclusions, splits, tasks, settings, source=job.wildcards["source"])
    paths = [write_artifact(tables[k], job.output[k]) for k in KINDS]
    write_outputs(job, written=paths, config={"reliability": p, "tasks": tasks}, seed=settings.bootstrap.seed,
                  extra={"rows": {k: int(len(v)) for k, v in tables.items()}})


@stage("reliability_collect")
def stage_reliability_collect(job) -> None:
    p, tasks = job.params["reliability"], job.params["tasks"]
    settings = ReliabilitySettings.of(p)
    tables = {}
    for kind in KINDS:
        frames = [pd.read_parquet(f) for f in job.input[kind]]
        frames = [f for f in frames if not f.empty]
        tables[kind] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    tables["coverage"] = pd.concat([tables["coverage"], harmonised_coverage(settings, job.params["datasets"], tasks)],
                                   ignore_index=True)
    paths = [write_artifact(tables[k], job.output[k]) for k in KINDS]
    write_outputs(job, written=paths, config={"reliability": p})
    sub = analysis_subgroup_metrics(tables["subgroups"])
    scores = summary_scores(tables["gaps"], tables["metrics"], tasks, settings)
    from retinabench.metrics.fairness import FORMULAS
    write_outputs(job, written=[write_artifact(sub, job.output["subgroup_metrics"])], config={"reliability": p},
              inputs=[job.output["subgroups"]],
              extra={"note": "analysis-layer format: METRICS columns + attribute + group; own-task models, "
                                     "decisions y_pred as written"})
    write_outputs(job, written=[write_artifact(scores, job.output["scores"])], config={"reliability": p},
              inputs=[job.output["gaps"], job.output["metrics"]],
              extra={"formulas": FORMULAS, "fairness_score_attributes": settings.fairness_score_attributes,
                     "doc": "docs/reliability.md"})


@stage("reliability_paired")
def stage_reliability_paired(job) -> None:
    from retinabench.schemas import read_table
    p, tasks = job.params["reliability"], job.params["tasks"]
    settings = ReliabilitySettings.of(p)
    frames = []
    for source, paths in job.params["sources"].items():
        for path in paths:
            frames.append(prepare_predictions(read_table(path, "predictions"), tasks, source))
    preds = pd.concat(frames, ignore_index=True)
    manifest = _read_many(job.input["manifests"], "manifest")
    comp, dom = paired_comparisons(preds, manifest, tasks, settings, job.params["encoders"])
    paths = [write_artifact(comp, job.output["comparisons"]), write_artifact(dom, job.output["domains"])]
    write_outputs(job, written=paths, config={"reliability": p}, seed=settings.bootstrap.seed,
                  extra={"n_comparisons": int(len(comp)), "n_domain_rows": int(len(dom))})


@stage("reliability_figure")
def stage_reliability_figure(job) -> None:
    """One reliability figure as a folder of panel groups (figures/reliability.py) plus ``skipped.csv``: the groups
    and rows left out for lack of data, with the reason (collected into the skipped-analyses table)."""
    import shutil

    from retinabench import skipped as skip_table
    from retinabench.figures.reliability import FIGURES
    figures, which = ReliabilitySettings.of(job.params["reliability"]).figures, job.params["figure"]
    protocols = job.params["protocols"]
    # default: the linear probe (calibrated probabilities; kNN votes are coarse), else the first protocol run
    default = "linear" if "linear" in protocols else protocols[0]
    sel = {**figures.plain(), "protocol": figures.protocol or default}
    tables = {k: pd.read_parquet(v) for k, v in job.input.items()}
    out_dir = Path(job.output["dir"])
    if out_dir.exists():
        shutil.rmtree(out_dir)  # a rerun must not keep panel groups that no longer have data
    out_dir.mkdir(parents=True)
    paths, skipped = FIGURES[which](tables, job.params["encoders"], out_dir, sel, groups=job.params.get("groups"))
    rows = [skip_table.record(which, r["reason"], part=r["part"], n=r["n"], source="figure") for r in skipped]
    paths.append(write_artifact(skip_table.frame(rows), out_dir / "skipped.csv"))
    write_outputs(job, written=paths, config={"reliability": {"figures": sel}},
                  extra={"figure": which, "panel_groups": sorted(Path(p).stem for p in paths if p.endswith(".png"))})


@stage("protocol_sensitivity")
def stage_protocol_sensitivity(job) -> None:
    """Both values of each named convention on the same features / predictions (retinabench.reliability.
    sensitivity_run): one table."""
    from functools import cache

    from retinabench.features.extract import load_features
    from retinabench.reliability.sensitivity_run import SensitivityInputs, l2_normalised, protocol_sensitivity
    from retinabench.schemas import read_table
    p, tasks, sp = job.params["reliability"], job.params["tasks"], job.params["sensitivity"]
    settings = ReliabilitySettings.of(p)
    manifest = _read_many(job.input["manifests"], "manifest")
    splits = {Path(s).stem: read_table(s, "split") for s in job.input["splits"]}
    frames = [prepare_predictions(read_table(path, "predictions"), tasks, key.split("/")[0])
              for key, path in sp["predictions"].items()]
    preds = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cache
    def features(key: str, extracted: bool = False):
        return load_features((sp["extracted"] if extracted else sp["features"])[key])

    from retinabench.plan.sensitivity import BASE, DERIVE, EXTRACT, variant_name
    cells = {}
    for convention, encoders in sp["feature_sources"].items():
        for encoder, values in encoders.items():
            for task, spec in tasks.items():
                dataset = spec["dataset"]
                got = {}
                for value, source in values.items():
                    base = f"{encoder}/{dataset}"
                    if source == BASE:
                        got[value] = features(base)
                    elif source == DERIVE:
                        ids, x = features(base)
                        got[value] = (ids, l2_normalised(x))
                    elif source == EXTRACT:
                        got[value] = features(f"{variant_name(convention, value)}/{base}", True)
                    else:
                        got[value] = source   # the reason the two values are not compared
                cells[(convention, encoder, task)] = got
    table = protocol_sensitivity(SensitivityInputs(settings, tasks, manifest), preds=preds, features=cells,
                                 splits=splits, logreg=sp["logreg"], configured=sp["configured"],
                                 encoder_order=sp["encoders"])
    path = write_artifact(table, job.output["table"], "protocol_sensitivity")
    done = table[~table["skipped"]]
    write_outputs(job, written=[path], config={"reliability": p, "sensitivity": sp}, seed=settings.bootstrap.seed,
                  extra={"rows": int(len(table)), "skipped": int(table["skipped"].sum()),
                         "conclusions_changed": {c: int(g["conclusion_changes"].sum())
                                                 for c, g in done.groupby("convention")},
                         "doc": "docs/reliability.md#protocol-sensitivity"})


@stage("protocol_sensitivity_figure")
def stage_protocol_sensitivity_figure(job) -> None:
    """One forest plot per convention (figures/protocol_sensitivity.py) in the figure folder."""
    import shutil

    from retinabench.figures.protocol_sensitivity import forest_plots
    from retinabench.schemas import read_table
    table = read_table(job.input["table"], "protocol_sensitivity")
    out_dir = Path(job.output["dir"])
    if out_dir.exists():
        shutil.rmtree(out_dir)  # a rerun must not keep a convention no longer compared
    out_dir.mkdir(parents=True)
    paths = forest_plots(table, out_dir)
    write_outputs(job, written=paths, extra={"figures": sorted(Path(p).stem for p in paths)})


def _focus_rows(job):
    """FOCUS's aggregated rows with their model groups (reliability/focus_tables.py)."""
    from retinabench.reliability import focus_tables as ft
    p = job.params
    rows = ft.focus_rows(pd.read_parquet(job.input["metrics"]), pd.read_parquet(job.input["gaps"]), p["tasks"],
                         regime=p["regime"], fairness_attributes=p["fairness_attributes"])
    return ft.with_groups(rows, ft.model_groups(p["encoders"]))


def _comparisons(job):
    paths = job.input.get("comparisons") or []
    return pd.read_parquet(paths[0] if isinstance(paths, list) else paths) if paths else None


def _focus_config(job) -> dict:
    return {k: job.params[k] for k in ("regime", "fairness_attributes", "variant")}


@stage("focus_tables")
def stage_focus_tables(job) -> None:
    """FOCUS Tables 3, 4 and (with LoRA) 10 as CSV + LaTeX, each with its sidecar."""
    from retinabench.reliability import focus_tables as ft
    rows = _focus_rows(job)
    out: dict = {}
    if "table3_csv" in job.output:
        t3 = ft.table3(rows)
        out |= {"table3_csv": t3, "table3_tex": ft.table3_latex(t3)}
    if "table4_csv" in job.output:
        t4 = ft.table4(rows)
        out |= {"table4_csv": t4, "table4_tex": ft.wide_latex(
            t4, "Per dataset: mean over general vs ophthalmic (and medical) models of each family (FOCUS Table 4)")}
    if "table10_csv" in job.output:
        comp = _comparisons(job)
        if comp is None:
            raise ValueError("focus_tables: Table 10 is planned but no LoRA comparisons table was given")
        t10 = ft.table10(comp, variant=job.params["variant"])
        out |= {"table10_csv": t10, "table10_tex": ft.wide_latex(
            t10, "Post-SFT MLLMs in-domain vs out-of-domain: mean over adapter comparisons (FOCUS Table 10)")}
    write_outputs(job, out, config=_focus_config(job),
                  extra={"formulas": ft.FORMULAS, "n_rows": int(len(rows)), "doc": "docs/reliability.md"})


@stage("focus_figure")
def stage_focus_figure(job) -> None:
    """One FOCUS figure (figures/focus.py) as PNG + PDF with sidecars."""
    from retinabench.figures.focus import FIGURES as DRAW
    from retinabench.reliability import focus_tables as ft
    which, p = job.wildcards["figure"], job.params
    bins = pd.read_parquet(job.input["bins"]) if "bins" in job.input else None
    rows = None if which == "sft_deltas" else _focus_rows(job)
    data = ft.figure_data(which, rows, bins=bins, comparisons=_comparisons(job), regime=p["regime"],
                          variant=p["variant"])
    if data.empty:
        raise ValueError(f"FOCUS figure {which}: no data to draw (planned from the config, but its inputs are empty)")
    written = DRAW[which](data, job.output["png"])
    write_outputs(job, written=written, config=_focus_config(job), extra={"figure": which, "rows": int(len(data))})
