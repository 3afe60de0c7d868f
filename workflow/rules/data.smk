# Data stage: raw layout -> manifest + exclusions + decode pass -> duplicate clusters -> one split per dataset ->
# per-task views of it; image cache; duplicates across datasets (retinabench.pipeline.data, retinabench.data).

from retinabench.data.split_file import split_inputs, split_source


rule phantom:
    output:
        metadata=P.phantom_metadata,
    log:
        P.log("phantom"),
    wildcard_constraints:
        generated_root=P.alternatives_of(P.generated_roots),
    conda:
        CORE_ENV
    params:
        code=P.code("phantom"),
        phantom=P.phantom_settings,
    script:
        STAGE


rule manifest:
    input:
        # the raw fingerprint covers every raw file's content; index files are inputs only when generated
        index=lambda wc: P.index_inputs(wc.dataset),
        fingerprint=lambda wc: P.raw_fingerprint(wc.dataset, main_process=workflow.is_main_process),
    output:
        manifest=P.path("manifest"),
        exclusions=P.path("exclusions"),
        hashes=P.path("image_hashes"),
        raw_files=P.path("raw_files"),
    log:
        P.log("manifest"),
    conda:
        CORE_ENV
    threads: 8
    params:
        # Only this dataset's adapter and the helpers it imports: adding or editing another adapter reruns nothing.
        code=P.manifest_code,
        dataset=lambda wc: REG.dataset(wc.dataset),
        images=P.images_settings,
        # where the raw folder is, not what decides a rerun (P.located): moving data_root reruns nothing
        locations=P.located(root=P.dataset_root),
    script:
        STAGE


rule duplicates:
    input:
        manifest=P.path("manifest"),
        hashes=P.path("image_hashes"),
    output:
        duplicates=P.path("duplicates"),
    log:
        P.log("duplicates"),
    conda:
        CORE_ENV
    params:
        code=P.code("duplicates"),
        duplicates=config["duplicates"],
    script:
        STAGE


rule split:
    input:
        manifest=P.path("manifest"),
        duplicates=P.path("duplicates"),
        # split.method file: the dataset's split file (or folder); its content hash is in params
        split_file=lambda wc: split_inputs(config["split"], wc.dataset),
    output:
        split=P.path("assignment"),
    log:
        P.log("split"),
    conda:
        CORE_ENV
    params:
        code=P.code("split"),
        split=config["split"],
        split_source=lambda wc: split_source(config["split"], wc.dataset),
        # every registry task of the dataset (not only the selected ones): one assignment whatever a config selects
        tasks=lambda wc: P.dataset_tasks(wc.dataset),
    script:
        STAGE


rule task_split:
    input:
        manifest=P.path("manifest"),
        exclusions=P.path("exclusions"),
        assignment=P.path("assignment"),
    output:
        split=P.path("task_split"),
    log:
        P.log("task_split"),
    conda:
        CORE_ENV
    params:
        code=P.code("task_split"),
        task=lambda wc: REG.task(wc.task),
        seed=config["split"]["seed"],
    script:
        STAGE


rule cross_duplicates:
    input:
        hashes=[P.path("image_hashes", dataset=d) for d in P.datasets],
        splits=[P.path("assignment", dataset=d) for d in P.datasets],
    output:
        pairs=P.path("cross_duplicates"),
    log:
        P.log("cross_duplicates"),
    conda:
        CORE_ENV
    params:
        code=P.code("cross_duplicates"),
        duplicates=config["duplicates"],
        datasets=P.datasets,
    script:
        STAGE


rule image_cache:
    input:
        manifest=P.path("manifest"),
    output:
        **P.cache_files("{dataset}"),
    log:
        P.log("image_cache"),
    conda:
        CORE_ENV
    threads: 2
    resources:
        mem_mb=2000,
    params:
        code=P.code("image_cache"),
        image_cache=config["image_cache"],
        locations=P.located(root=P.dataset_root),
    script:
        STAGE
