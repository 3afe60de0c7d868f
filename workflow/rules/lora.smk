# LoRA SFT of MLLMs (config `lora:`): one training job per (MLLM, source task) with `lora.gpus` GPUs (one process
# per GPU through torchrun), one inference job per adapter on its in- and out-of-domain test tasks (1 GPU), and
# the adapter - base paired deltas (FOCUS Table 5). Plan: retinabench.plan.lora; stages:
# retinabench.pipeline.lora. A training job's checkpoints (results/lora/<encoder>/<task>/checkpoints) are not an
# output: Snakemake leaves them when it cleans a killed job's outputs, and the rerun resumes from them.

LP = P.lora


rule mllm_lora_train:
    input:
        unpack(LP.train_inputs),
    output:
        adapter=directory(LP.train_outputs()["adapter"]),
        train_log=LP.train_outputs()["train_log"],
        compute=LP.train_outputs()["compute"],
    log:
        P.log("mllm_lora_train"),
    wildcard_constraints:
        encoder=LP.constraint_encoders,
        task=LP.constraint_tasks,
    conda:
        MLLM_ENV
    threads: LP.settings.threads
    resources:
        mem_mb=LP.train_resource("mem_mb"),
        runtime=LP.train_resource("runtime"),
        gpu=LP.train_resource("gpu"),
    params:
        code=P.code("mllm_lora_train"),
        job=LP.train_params,
    script:
        STAGE


rule mllm_lora_infer:
    input:
        unpack(LP.infer_inputs),
    output:
        **LP.infer_outputs(),
    log:
        P.log("mllm_lora_infer"),
    wildcard_constraints:
        encoder=LP.constraint_encoders,
        task=LP.constraint_tasks,
    conda:
        MLLM_ENV
    threads: 2
    resources:
        mem_mb=LP.infer_resource("mem_mb"),
        runtime=LP.infer_resource("runtime"),
        gpu=LP.infer_resource("gpu"),
    params:
        code=P.code("mllm_lora_infer"),
        job=LP.infer_params,
        locations=LP.infer_locations(),
    script:
        STAGE


rule mllm_lora_deltas:
    input:
        **LP.delta_inputs(),
    output:
        comparisons=LP.delta_outputs()["comparisons"],
        domains=LP.delta_outputs()["domains"],
        pairs=LP.delta_outputs()["pairs"],
        unpaired=LP.delta_outputs()["unpaired"],
        table5=report(
            LP.delta_outputs()["table5"],
            caption="../report/appendix/lora_table5.rst",
            category=LP.report_section,
            labels={"table": "Table 5 (adapter - base)"},
        ),
        figure=report(
            LP.delta_outputs()["figure"],
            caption="../report/appendix/lora_table5.rst",
            category=LP.report_section,
            labels={"figure": "Table 5 (adapter - base)"},
        ),
        figure_pdf=LP.delta_outputs()["figure_pdf"],
    log:
        P.log("mllm_lora_deltas"),
    conda:
        CORE_ENV
    threads: 1
    params:
        code=P.code("mllm_lora_deltas"),
        tasks=LP.delta_params()["tasks"],
        deltas=LP.delta_params()["deltas"],
        calibration=P.reliability.parts("n_bins", "ece_bin_edges"),
    script:
        STAGE
