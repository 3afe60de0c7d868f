# Analysis stage: one tidy metrics table -> encoder ranks -> statistics, figures and tables, one job per figure
# family (never one per task). Which families run is decided from the config alone by
# retinabench.plan.family_outputs.analysis_outputs(): a family whose inputs this config does not produce (fewer than
# three encoders for a Friedman test, no augmented linear probe for the FT-LP gap, no sweep, ...) has no rule and
# no target. Single-protocol analyses run on fine-tuning when it is ranked, else on analysis.fallback_protocol.
# Figures are report() outputs with a caption (workflow/report/*.rst), grouped by section. Plan: P.analysis.
AN = P.analysis


rule collect_metrics:
    input:
        metrics=P.metrics_files(),
    output:
        metrics=P.path("metrics"),
        csv=P.path("metrics_csv"),
    log:
        P.log("collect_metrics"),
    conda:
        CORE_ENV
    script:
        STAGE


for _family, _rule_name in AN.families():

    rule:
        name:
            _rule_name
        input:
            **AN.inputs(_family),
        output:
            **AN.reported_outputs(_family, report),
        log:
            P.log("analysis", family=_family),
        conda:
            CORE_ENV
        params:
            **AN.params(_family),
            code=P.code(_rule_name),
            runs=AN.runs,
        script:
            STAGE


rule baselines:
    input:
        **AN.baselines_inputs(),
    output:
        baselines=report(
            AN.baselines_file,
            caption="../report/baselines.rst",
            category=AN.ranking_section,
            subcategory="Tables",
            labels={"figure": "baselines", "metric": "all"},
        ),
    log:
        P.log("baselines"),
    conda:
        CORE_ENV
    params:
        **AN.baselines_params(),
        code=P.code("baselines"),
    script:
        STAGE


# The skipped-analyses table: planned skips (AN.planned_skips, the reliability plan, opt-in layers), every
# reliability figure job's skipped.csv, the reliability coverage and the fairness table; printed by the
# Snakefile's onsuccess handler, shown in the report.
rule skipped_analyses:
    input:
        **AN.skipped_inputs(),
    output:
        table=report(
            AN.skipped_table,
            caption="../report/skipped_analyses.rst",
            category=AN.skipped_section,
            labels={"figure": "skipped analyses", "metric": "all"},
        ),
    log:
        P.log("skipped_analyses"),
    conda:
        CORE_ENV
    params:
        **AN.skipped_params(),
        code=P.code("skipped_analyses"),
        locations=P.located(figure_tables=AN.skipped_figure_tables()),
    script:
        STAGE
