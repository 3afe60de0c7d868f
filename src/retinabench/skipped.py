"""The skipped-analyses table: every analysis, figure, panel or report section a run did not produce, and why.

Three sources, one table (``results/skipped_analyses.csv``, shown in the report and printed when the run ends):

- **planned** — decided from the configuration before anything runs: a family whose inputs this config cannot
  produce (fewer than three encoders for Friedman / Nemenyi and Spearman, no fine-tuning for the FT − LP gap, no
  sweep, no second dataset for transfer, ...; :func:`retinabench.plan.family_outputs.analysis_outputs` records them);
- **figure** — panel groups and rows a figure job left out because they had no data (an attribute without values
  in a dataset, a group below the minimum size), written by the job beside its figures (``skipped.csv``);
- **reliability** — subgroup and quality analyses the reliability layer could not compute, summarised from its
  coverage table (``reliability/coverage.parquet``, status ``skipped``), and attributes without subgroup data
  in the analysis layer's fairness table.

Columns: ``section`` (report section), ``output`` (figure / table / analysis name), ``part`` (panel group or
scope; ``all`` for the whole output), ``reason``, ``n`` (cells affected, where counted), ``source``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

COLUMNS = ["section", "output", "part", "reason", "n", "source"]

RANKING, PROTOCOLS, SUBSETS, LEAKAGE, FAIRNESS, SENSITIVITY, RELIABILITY = (
    "1. Ranking", "2. Protocols", "3. Subsets", "4. Leakage", "5. Fairness", "6. Sensitivity", "7. Reliability")
SKIPPED_SECTION = "0. Skipped analyses"
# Opt-in layers whose figures are files, not report sections (workflow/rules/saliency.smk, compute.smk).
SALIENCY_COMPUTE = "8. Saliency and compute"
LORA = "9. LoRA fine-tuning of MLLMs"   # opt-in (config `lora:`), workflow/rules/lora.smk
# Report section of every figure and report table (workflow/rules/*.smk use it for the report's categories).
SECTIONS: dict[str, str] = {
    "rank_distribution": RANKING, "cd_diagram": RANKING, "ranking_table": RANKING, "appendix_table": RANKING,
    "baselines": RANKING, "rank_distribution_linear_probe": RANKING, "cd_diagram_linear_probe": RANKING,
    "protocol_rank_heatmap": PROTOCOLS, "spearman_protocols": PROTOCOLS, "spearman_regimes": PROTOCOLS,
    "srd_protocols": PROTOCOLS, "ft_lp_gap": PROTOCOLS, "protocol_rank_heatmap_extended": PROTOCOLS,
    "spearman_protocols_extended": PROTOCOLS, "srd_protocols_extended": PROTOCOLS,
    "srd_subsets": SUBSETS, "subset_ranks": SUBSETS,
    "leakage_rank_change": LEAKAGE, "top_k": LEAKAGE, "top_k_oct": LEAKAGE,
    "attribute_distribution": FAIRNESS, "subgroup_accuracy": FAIRNESS, "fairness_gaps": FAIRNESS, "subgroup_scatter": FAIRNESS,
    "lr_sensitivity": SENSITIVITY, "srd_lr": SENSITIVITY, "lr_transfer": SENSITIVITY,
    "protocol_sensitivity": SENSITIVITY,
    "reliability_diagrams": RELIABILITY, "transfer": RELIABILITY,
    "skipped_analyses": SKIPPED_SECTION, "saliency": SALIENCY_COMPUTE, "compute": SALIENCY_COMPUTE,
    "lora_table5": LORA,
    # FOCUS's tables and figures (plan/focus.py); Table 10 and the SFT panels belong with Table 5
    **{f"focus_{n}": RELIABILITY for n in ("table3", "table4", "spiders", "auroc_ece", "mllm_size",
                                            "probe_vs_zeroshot", "dataset_heatmap", "calibration_curves")},
    "focus_table10": LORA, "focus_sft_deltas": LORA,
}
SECTION_ORDER = [RANKING, PROTOCOLS, SUBSETS, LEAKAGE, FAIRNESS, SENSITIVITY, RELIABILITY]


def record(output: str, reason: str, *, part: str = "all", n: int | None = None, source: str = "planned",
           section: str | None = None) -> dict:
    """One row of the skipped table (``section`` defaults to the output's report section)."""
    return {"section": section or SECTIONS.get(output, ""), "output": output, "part": part, "reason": reason,
            "n": n, "source": source}


def optional_layers(config: dict) -> list[dict]:
    """Rows for the opt-in layers a config leaves off (saliency maps, the compute benchmark, LoRA), so that the table
    says they were not produced and how to turn them on."""
    rows = []
    if not config["saliency"]["enabled"]:
        rows.append(record("saliency", "saliency maps are opt-in: set saliency.enabled: true (needs "
                                       "finetune.enabled: they explain the fine-tuned models)"))
    if not config["compute"]["enabled"]:
        rows.append(record("compute", "the compute benchmark is opt-in: set compute.enabled: true (its timings "
                                      "and memory belong to the device the jobs run on)"))
    if not config["lora"]["enabled"]:
        rows.append(record("lora_table5", "LoRA SFT of MLLMs is opt-in: set lora.enabled: true with lora.sources "
                                          "(needs mllm.enabled for the base-model results)"))
    return rows


def frame(rows) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=COLUMNS)
    df["n"] = pd.to_numeric(df["n"]).astype("Int64")
    return df


def write(rows, path) -> str:
    """Write skipped rows as CSV (columns COLUMNS; an empty table keeps its header)."""
    from retinabench.atomic import atomic_write
    table = frame(rows)
    atomic_write(path, lambda tmp: table.to_csv(tmp, index=False))
    return str(path)


def read(path) -> pd.DataFrame:
    df = pd.read_csv(path, dtype={"section": str, "output": str, "part": str, "reason": str, "source": str},
                     keep_default_na=False, na_values={"n": [""]})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise KeyError(f"{path}: skipped table lacks columns {missing}")
    return frame(df[COLUMNS].to_dict("records"))


def from_coverage(coverage: pd.DataFrame) -> list[dict]:
    """Subgroup / quality analyses the reliability layer skipped, one row per (attribute, dataset, reason) with the
    number of evaluation cells (encoder × protocol × task × regime) affected."""
    if coverage.empty:
        return []
    c = coverage[(coverage["status"] == "skipped") & coverage["scope"].astype(str).str.startswith("attribute:")]
    rows = []
    for (scope, dataset, reason), g in c.groupby(["scope", "dataset", "reason"], sort=True):
        attr = str(scope).split(":", 1)[1]
        rows.append(record("subgroup gaps", str(reason), part=f"{attr} / {dataset}", n=int(len(g)),
                           source="reliability", section=FAIRNESS))
    return rows


def from_subgroup_table(table: pd.DataFrame) -> list[dict]:
    """Attributes of the analysis layer's fairness table (``analysis/subgroup_accuracy.csv``) without data."""
    if table.empty or "reason" not in table.columns:
        return []
    t = table[table["reason"].fillna("").astype(str) != ""]
    return [record("subgroup_accuracy", str(r["reason"]), part=str(r["attribute"]), source="figure")
            for r in t.drop_duplicates(["attribute", "reason"]).to_dict("records")]


def collect(planned: list[dict], figure_tables: dict[str, str], *, coverage: str | None = None,
            subgroup_table: str | None = None, produced: Sequence[str] = ()) -> pd.DataFrame:
    """The run's skipped table: ``planned`` rows, each figure job's ``skipped.csv`` (``{output name: path}``), the
    reliability coverage and the fairness table; plus a row for every report section none of whose outputs was
    produced (``produced``: output names the run wrote)."""
    rows = list(planned)
    for output, path in sorted(figure_tables.items()):
        for r in read(path).to_dict("records"):
            rows.append({**r, "output": r["output"] or output,
                         "section": r["section"] or SECTIONS.get(output, "")})
    if coverage and Path(coverage).is_file():
        rows += from_coverage(pd.read_parquet(coverage))
    if subgroup_table and Path(subgroup_table).is_file():
        rows += from_subgroup_table(pd.read_csv(subgroup_table))
    have = {SECTIONS.get(o) for o in produced}
    for section in SECTION_ORDER:
        if section not in have:
            rows.append(record("(whole section)", "no figure or table of this section was produced (rows above)",
                               section=section))
    df = frame(rows)
    order = {s: i for i, s in enumerate([*SECTION_ORDER, SALIENCY_COMPUTE, LORA, SKIPPED_SECTION, ""])}
    df = df.assign(_s=df["section"].map(lambda s: order.get(s, len(order)))).sort_values(
        ["_s", "output", "part"], kind="stable").drop(columns="_s").reset_index(drop=True)
    return df


def format_table(df: pd.DataFrame, *, width: int = 110) -> str:
    """Plain-text table for a terminal or log (long reasons wrap under their row)."""
    import textwrap
    if df.empty:
        return "Skipped analyses: none (every planned analysis, figure and report section was produced)."
    lines = [f"Skipped analyses ({len(df)}): what this run did not produce, and why"]
    head = ["section", "output", "part", "n"]
    cols = {c: max(len(c), *(len(str(v)) for v in df[c].astype(str).replace("<NA>", ""))) for c in head}
    cols = {c: min(w, 28) for c, w in cols.items()}
    fmt = "  ".join(f"{{:<{cols[c]}}}" for c in head)
    lines.append(fmt.format(*head) + "  reason")
    indent = sum(cols.values()) + 2 * len(head)
    for r in df.to_dict("records"):
        vals = ["" if pd.isna(r[c]) else str(r[c]) for c in head]
        vals = [v if len(v) <= cols[c] else v[:cols[c] - 1] + "…" for v, c in zip(vals, head)]
        reason = textwrap.wrap(str(r["reason"]), max(30, width - indent)) or [""]
        lines.append(fmt.format(*vals) + "  " + reason[0])
        lines += [" " * indent + more for more in reason[1:]]
    return "\n".join(lines)


def print_table(path, file=None) -> None:
    """Print the skipped table of a finished run (the Snakefile's ``onsuccess:`` handler calls this)."""
    file = file or sys.stdout
    path = Path(path)
    if not path.is_file():
        print(f"Skipped analyses: {path} not written by this run.", file=file)
        return
    import datetime
    written = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    print(format_table(read(path)), file=file)
    print(f"(table: {path}, written {written})", file=file)
