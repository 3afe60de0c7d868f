# Reliability stage: calibration, thresholds, fairness and quality gaps, transfer, paired bootstrap.
# Jobs: transfer (encoder x harmonised group with >= 2 datasets), reliability (one per predictions table of any
# protocol: the plan lists them), reliability_collect, reliability_paired and four figure jobs. Formulas and outputs:
# docs/reliability.md. Plan: P.reliability.
REL = P.reliability


rule transfer:
    input:
        features=lambda wc: [P.features(wc.encoder, d) for d in REL.datasets_of("transfer", wc.group)],
        splits=lambda wc: [P.task_split(t) for t in REL.transfer_groups[wc.group]],
    output:
        predictions=P.path("predictions", source="transfer", name="{group}"),
    log:
        P.log("transfer"),
    wildcard_constraints:
        group=REL.group_constraint,
    conda:
        TORCH_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        code=P.code("transfer"),
        tasks=lambda wc: [REG.task(t) for t in REL.transfer_groups[wc.group]],
        transfer=REL.parts("transfer")["transfer"],
        probes=P.protocol_settings(REL.settings.transfer.protocols),
    script:
        STAGE


rule reliability:
    input:
        unpack(REL.job_inputs),
    output:
        **REL.job_outputs(),
    log:
        P.log("reliability"),
    wildcard_constraints:
        source="[a-z][a-z0-9_]*",
    conda:
        CORE_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        code=P.code("reliability"),
        reliability=REL.job_settings,
        tasks=lambda wc: {t: REG.task(t) for t in REL.tasks_of(wc.source, wc.name)},
    script:
        STAGE


rule reliability_collect:
    input:
        **{k: REL.job_tables(k) for k in REL.kinds},
    output:
        **REL.collect_outputs(),
    log:
        P.log("reliability_collect"),
    conda:
        CORE_ENV
    params:
        code=P.code("reliability_collect"),
        reliability={**REL.job_settings, **REL.parts("harmonised")},
        tasks=REL.plan_tasks,
        datasets=P.datasets,
    script:
        STAGE


rule reliability_paired:
    input:
        predictions=[p for paths in REL.paired_sources().values() for p in paths],
        manifests=[P.path("manifest", dataset=d) for d in P.datasets],
    output:
        **REL.paired_outputs(),
    log:
        P.log("reliability_paired"),
    conda:
        CORE_ENV
    params:
        code=P.code("reliability_paired"),
        reliability=REL.parts("paired", "bootstrap", "n_bins", "ece_bin_edges"),
        tasks=REL.plan_tasks,
        encoders=P.encoders,
        # the predictions files (inputs) by source: locations (P.located), the files' content decides
        locations=P.located(sources=REL.paired_sources()),
    script:
        STAGE


rule reliability_figure:
    input:
        unpack(REL.figure_inputs),
    output:
        dir=report(
            directory(P.path("reliability_figure")),
            patterns=["{panel}.png"],
            caption="../report/reliability_figure.rst",
            category=REL.report_section,
            subcategory="{figure}",
            labels={"figure": "{figure}", "panel": "{panel}"},
        ),
    log:
        P.log("reliability_figure"),
    wildcard_constraints:
        figure=REL.figure_constraint,
    conda:
        CORE_ENV
    params:
        code=P.code("reliability_figure"),
        figure=lambda wc: wc.figure,
        reliability=REL.parts("figures"),
        protocols=config["protocols"],
        encoders=lambda wc: {e: REG.encoder(e) for e in P.encoders},
        groups=REL.transfer_groups,
    script:
        STAGE


# Protocol sensitivity (reliability.protocol_sensitivity, opt-in): both values of each named convention on the
# same features or predictions (docs/reliability.md, "Protocol sensitivity"). Plan: REL.sensitivity.
SENS = REL.sensitivity


rule protocol_sensitivity_features:
    input:
        unpack(SENS.feature_inputs),
    output:
        features=P.path("sensitivity_features"),
    log:
        P.log("protocol_sensitivity_features"),
    wildcard_constraints:
        variant=SENS.variant_constraint(),
    conda:
        TORCH_ENV
    threads: 2
    resources:
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=P.encoder_resource("runtime"),
        gpu=P.encoder_resource("gpu"),
    params:
        code=P.code("protocol_sensitivity_features"),
        encoder=SENS.feature_entry,
        features=SENS.feature_settings,
    script:
        STAGE


rule protocol_sensitivity:
    input:
        **SENS.inputs(),
    output:
        table=SENS.table(),
    log:
        P.log("protocol_sensitivity"),
    conda:
        TORCH_ENV
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        code=P.code("protocol_sensitivity"),
        reliability=REL.parts(
            "protocol_sensitivity",
            "bootstrap",
            "n_bins",
            "ece_bin_edges",
            "attributes",
            "fairness_score_attributes",
            "min_group_size",
            "paired",
        ),
        tasks=REL.plan_tasks,
        sensitivity=SENS.params(),
        locations=P.located(sensitivity=SENS.files()),
    script:
        STAGE


rule protocol_sensitivity_figure:
    input:
        table=SENS.table(),
    output:
        dir=report(
            directory(SENS.figure_dir()),
            patterns=["{convention}.png"],
            caption="../report/protocol_sensitivity.rst",
            category=REL.section("protocol_sensitivity"),
            subcategory="protocol sensitivity",
            labels={"figure": "protocol sensitivity", "convention": "{convention}"},
        ),
    log:
        P.log("protocol_sensitivity_figure"),
    conda:
        CORE_ENV
    params:
        code=P.code("protocol_sensitivity_figure"),


# FOCUS's Tables 3, 4, 10 and figures (plan: P.reliability.focus, plan/focus.py; docs/reliability.md).
FOC = REL.focus


rule focus_tables:
    input:
        **FOC.table_inputs(),
    output:
        **{
            k: v if isinstance(v, str) else report(v.pop("path"), caption="../report/focus_table.rst", **v)
            for k, v in FOC.report_tables().items()
        },
    log:
        P.log("focus_tables"),
    conda:
        CORE_ENV
    params:
        **FOC.params(),
        code=P.code("focus_tables"),
    script:
        STAGE


rule focus_figure:
    input:
        unpack(FOC.figure_inputs),
    output:
        png=report(
            P.path("focus_figure", ext="png"),
            caption="../report/focus_figure.rst",
            category=FOC.report_section,
            labels={"figure": "{figure}"},
        ),
        pdf=P.path("focus_figure", ext="pdf"),
    log:
        P.log("focus_figure"),
    wildcard_constraints:
        figure=FOC.figure_constraint,
    conda:
        CORE_ENV
    params:
        **FOC.params(),
        code=P.code("focus_figure"),
    script:
        STAGE
