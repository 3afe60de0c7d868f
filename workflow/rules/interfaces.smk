# Prompt-based protocols (retinabench.protocols.registry kind `prompts`): CLIP-like zero-shot (protocols zeroshot,
# zeroshot_focus) and MLLM yes/no prompting (mllm, mllm_renorm). One GPU job per (registry entry, task set) per
# enabled interface (config `zeroshot:` / `mllm:`); the plan is retinabench.plan.interfaces.

IFP = P.interfaces
# The mllm rule's environment: vLLM's own (envs/vllm.yaml) on `mllm.backend: vllm`, else the MLLM one.
MLLM_JOB_ENV = VLLM_ENV if IFP.settings["mllm"].backend == "vllm" else MLLM_ENV


rule zeroshot:
    input:
        unpack(IFP.inputs("zeroshot")),
    output:
        **IFP.outputs("zeroshot"),
    log:
        P.log("zeroshot"),
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
        locations=IFP.locations("zeroshot"),
    script:
        STAGE


rule mllm:
    input:
        unpack(IFP.inputs("mllm")),
    output:
        **IFP.outputs("mllm"),
    log:
        P.log("mllm"),
    conda:
        MLLM_JOB_ENV
    threads: 2
    resources:
        mem_mb=IFP.resource("mllm", "mem_mb"),
        runtime=IFP.resource("mllm", "runtime"),
        gpu=IFP.resource("mllm", "gpu"),
    params:
        code=P.code("mllm"),
        job=IFP.params("mllm"),
        locations=IFP.locations("mllm"),
    script:
        STAGE


rule interface_tables:
    input:
        **IFP.table_inputs(),
    output:
        **IFP.tables(),
    log:
        P.log("interface_tables"),
    conda:
        CORE_ENV
    threads: 1
    params:
        code=P.code("interface_tables"),
        tasks=IFP.table_params()["tasks"],
    script:
        STAGE


# The demo's tiny random models (demo registries only: entries with `tiny_model`), seeded, into the weights_path
# folder their sha256 pins describe.
rule tiny_model:
    output:
        folder=directory(P.tiny_model_folder()),
    log:
        P.log("tiny_model"),
    wildcard_constraints:
        name=P.tiny_model_constraint(),
    conda:
        TORCH_ENV
    threads: 1
    params:
        code=P.code("tiny_model"),
        build=P.tiny_model_params,
    script:
        STAGE
