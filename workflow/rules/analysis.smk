# Analysis stage: one tidy metrics table -> encoder ranks -> statistics, figures and tables, one job per figure
# family (never one per task). Which families run is decided from the config alone by
# retinabench.stages_analysis.analysis_outputs(): a family whose inputs this config does not produce (fewer than
# three encoders for a Friedman test, no augmented linear probe for the FT-LP gap, no sweep, ...) has no rule and
# no target. Single-protocol analyses run on fine-tuning when it is ranked, else on analysis.fallback_protocol. Figures are report() outputs with a caption (workflow/report/*.rst), grouped by section.
from retinabench import skipped as SKIP
from retinabench.stages_analysis import AnalysisContext, analysis_outputs, baselines_path, family_inputs

ANALYSIS = AnalysisContext.from_config(config, REG, encoders=PLAN.encoders, tasks=PLAN.tasks,
                                       datasets=PLAN.datasets)
ANALYSIS_SKIPPED = []  # figures and tables this config cannot produce, with the reason (skipped_analyses.csv)
AOUT = analysis_outputs(ANALYSIS, R, ANALYSIS_SKIPPED)
ANALYSIS_CODE = code_hash(*[f"stats/{m}.py" for m in ("ranks", "friedman", "agreement", "distance", "subsets",
                                                       "leakage", "protocols", "sensitivity", "fairness", "tables",
                                                       "baselines")],
                          *[f"figures/{m}.py" for m in ("style", "ranks", "cd", "agreement", "bars", "scatter")],
                          "stages_analysis.py", "skipped.py")
# What the captions say the figures come from (the provenance sidecars hold the file-level chain).
ANALYSIS_RUNS = (f"{len(PLAN.encoders)} encoders ({', '.join(PLAN.encoders)}); {len(PLAN.tasks)} tasks "
                 f"({', '.join(PLAN.tasks)}); protocols {', '.join(config['protocols'])}; seeds "
                 f"{', '.join(map(str, config['seeds']))}; regimes {', '.join(config['regimes'])}; "
                 f"{ANALYSIS.split} split")

# family -> (rule name, {output key: (caption, report category, subcategory)}). Keys "png_<metric>" of the
# ranking families reuse the caption of "png" with a metric label. Sections: retinabench.skipped.SECTIONS.
RANKING, PROTOCOLS, SUBSETS, LEAKAGE, FAIRNESS, SENSITIVITY = (SKIP.RANKING, SKIP.PROTOCOLS, SKIP.SUBSETS,
                                                              SKIP.LEAKAGE, SKIP.FAIRNESS, SKIP.SENSITIVITY)
ANALYSIS_RULES = {
    "ranks": ("ranks", {}),
    "rank_figures": ("figure_rank_distribution", {"png": ("rank_distribution", RANKING, "Rank distributions")}),
    "tables": ("analysis_tables", {"ranking_csv": ("ranking_table", RANKING, "Tables"),
                                   "appendix_csv": ("appendix_table", RANKING, "Tables")}),
    "cd": ("critical_difference", {"png": ("cd_diagram", RANKING, "Critical difference")}),
    "protocol_heatmap": ("protocol_heatmap", {"png": ("protocol_rank_heatmap", PROTOCOLS, "Mean rank per protocol")}),
    "agreement": ("rank_agreement", {"png_protocols": ("spearman_protocols", PROTOCOLS, "Spearman correlation"),
                                     "png_regimes": ("spearman_regimes", PROTOCOLS, "Spearman correlation")}),
    "distance": ("signed_rank_distance",
                 {"png_protocols": ("srd_protocols", PROTOCOLS, "Signed rank distance"),
                  "png_subsets": ("srd_subsets", SUBSETS, "Signed rank distance")}),
    "ft_lp": ("ft_lp_gap", {"png": ("ft_lp_gap", PROTOCOLS, "Fine-tuning vs linear probe")}),
    "subsets": ("subset_ranks", {"png": ("subset_ranks", SUBSETS, "Mean rank by subset")}),
    "leakage": ("leakage", {"png": ("leakage_rank_change", LEAKAGE, "Rank change")}),
    "top_k": ("top_k", {"png": ("top_k", LEAKAGE, "Top encoders")}),
    "fairness": ("fairness", {"png": ("subgroup_accuracy", FAIRNESS, "Subgroups")}),
    "sensitivity": ("lr_sensitivity", {"png": ("lr_sensitivity", SENSITIVITY, "Learning rate"),
                                       "png_srd": ("srd_lr", SENSITIVITY, "Learning rate")}),
    "lr_transfer": ("lr_transfer", {"png": ("lr_transfer", SENSITIVITY, "Learning rate")}),
}


def analysis_targets():
    """Analysis outputs requested by `all` (only those whose inputs this config produces), the baselines and the
    skipped-analyses table."""
    return [path for outputs in AOUT.values() for path in outputs.values()] + [baselines_path(R),
                                                                               SKIPPED_TABLE]


def _reported_outputs(family):
    """The family's named outputs, figures (and report tables) wrapped in report() with caption and section."""
    spec = ANALYSIS_RULES[family][1]
    out = {}
    for key, path in AOUT[family].items():
        metric = key[len("png_"):] if key.startswith("png_") and key not in spec else None
        if metric and metric.startswith("part"):  # a further page of a long figure (lr_transfer_part2, ...)
            metric = None
            entry = spec.get("png")
        else:
            entry = spec.get(key) or (spec.get("png") if metric else None)
        if entry is None:
            out[key] = path
            continue
        caption, category, subcategory = entry
        out[key] = report(path, caption=f"../report/{caption}.rst", category=category, subcategory=subcategory,
                          labels={"figure": caption.replace("_", " "), "metric": metric or ANALYSIS.metric})
    return out


rule collect_metrics:
    input:
        metrics=all_metrics_files(),
    output:
        metrics=f"{R}/metrics.parquet",
        csv=f"{R}/metrics.csv",
    params:
        stage="collect_metrics",
    log:
        f"{R}/logs/collect_metrics.log",
    script:
        STAGE


for _family, (_rule_name, _spec) in ANALYSIS_RULES.items():
    if _family not in AOUT:
        continue

    rule:
        name:
            _rule_name
        input:
            **family_inputs(_family, R, ANALYSIS),
        output:
            **_reported_outputs(_family),
        params:
            stage=f"analysis_{_family}",
            code=ANALYSIS_CODE,
            runs=ANALYSIS_RUNS,
            **ANALYSIS.params_for(_family),
        log:
            f"{R}/logs/analysis/{_family}.log",
        script:
            STAGE


rule baselines:
    input:
        splits=[f"{R}/splits/{REG.task(t)['dataset']}/{t}.parquet" for t in PLAN.tasks],
    output:
        baselines=report(baselines_path(R), caption="../report/baselines.rst", category=RANKING,
                         subcategory="Tables", labels={"figure": "baselines", "metric": "all"}),
    params:
        stage="analysis_baselines",
        code=code_hash("stats/baselines.py", "metrics/classification.py", "stages_analysis.py"),
        tasks={t: REG.task(t) for t in PLAN.tasks},
        regimes=config["regimes"],
    log:
        f"{R}/logs/analysis/baselines.log",
    script:
        STAGE


# The skipped-analyses table: planned skips (above and reliability.smk), every figure job's skipped.csv, the
# reliability coverage and the fairness table; printed by the Snakefile's onsuccess handler, shown in the report.
SKIPPED_TABLE = f"{R}/skipped_analyses.csv"


def _produced_outputs():
    names = []
    for family, outputs in AOUT.items():
        spec = ANALYSIS_RULES[family][1]
        names += [spec[k][0] for k in outputs if k in spec]
    return names + [f for f in REL_FIGURES if f != "transfer" or TRANSFER_GROUPS] + ["baselines"]


rule skipped_analyses:
    input:
        figures=[f"{R}/figures/reliability/{f}" for f in REL_FIGURE_NAMES],
        coverage=f"{REL}/coverage.parquet",
        **({"subgroup_table": AOUT["fairness"]["table"]} if "fairness" in AOUT else {}),
    output:
        table=report(SKIPPED_TABLE, caption="../report/skipped_analyses.rst", category=SKIP.SKIPPED_SECTION,
                     labels={"figure": "skipped analyses", "metric": "all"}),
    params:
        stage="skipped_analyses",
        code=code_hash("skipped.py", "stages_analysis.py"),
        planned=ANALYSIS_SKIPPED + RELIABILITY_SKIPPED + SKIP.optional_layers(config),
        figure_tables={f: f"{R}/figures/reliability/{f}/skipped.csv" for f in REL_FIGURE_NAMES},
        produced=_produced_outputs(),
    log:
        f"{R}/logs/analysis/skipped_analyses.log",
    script:
        STAGE
