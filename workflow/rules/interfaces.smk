# Prompt-based protocols (retinabench.protocols.registry kind `prompts`): CLIP-like zero-shot (protocols zeroshot,
# zeroshot_focus) and MLLM yes/no prompting (mllm, mllm_renorm). One GPU job per (registry entry, task set) per
# enabled interface (config `zeroshot:` / `mllm:`); the plan is retinabench.pipeline.plan.interfaces.

IFP = P.interfaces


rule zeroshot:
    input:
        unpack(IFP.inputs("zeroshot")),
    output:
        **IFP.outputs("zeroshot"),
    log:
        f"{R}/logs/zeroshot/{{encoder}}/{{task_set}}.log",
    conda:
        TORCH_ENV
    threads: 2
    resources:
        mem_mb=IFP.resource("zeroshot", "mem_mb"),
        runtime=IFP.resource("zeroshot", "runtime"),
        gpu=IFP.resource("zeroshot", "gpu"),
    params:
        code=P.code("zeroshot"),
        job=IFP.params("zeroshot"),
    script:
        STAGE


rule mllm:
    input:
        unpack(IFP.inputs("mllm")),
    output:
        **IFP.outputs("mllm"),
    log:
        f"{R}/logs/mllm/{{encoder}}/{{task_set}}.log",
    conda:
        MLLM_ENV
    threads: 2
    resources:
        mem_mb=IFP.resource("mllm", "mem_mb"),
        runtime=IFP.resource("mllm", "runtime"),
        gpu=IFP.resource("mllm", "gpu"),
    params:
        code=P.code("mllm"),
        job=IFP.params("mllm"),
    script:
        STAGE


rule interface_tables:
    input:
        **IFP.table_inputs(),
    output:
        **IFP.tables(),
    log:
        f"{R}/logs/interfaces/tables.log",
    conda:
        CORE_ENV
    threads: 1
    params:
        code=P.code("interface_tables"),
        tasks=IFP.table_params()["tasks"],
    script:
        STAGE
