# Data stage: raw layout -> manifest + exclusions + decode pass -> duplicate clusters -> one split per dataset ->
# per-task views of it; image cache; duplicates across datasets (retinabench.pipeline.data, retinabench.data).


rule phantom:
    output:
        metadata=P.phantom_metadata,
    log:
        f"{R}/logs/phantom/{{generated_root}}.log",
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
        index=lambda wc: P.index_files(wc.dataset),
        fingerprint=lambda wc: P.raw_fingerprint(wc.dataset, main_process=workflow.is_main_process),
    output:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        exclusions=f"{R}/data/{{dataset}}/exclusions.parquet",
        hashes=f"{R}/data/{{dataset}}/image_hashes.parquet",
        raw_files=f"{R}/data/{{dataset}}/raw_files.parquet",
    log:
        f"{R}/logs/manifest/{{dataset}}.log",
    conda:
        CORE_ENV
    threads: 8
    params:
        # Only this dataset's adapter and the helpers it imports: adding or editing another adapter reruns nothing.
        code=P.manifest_code,
        dataset=lambda wc: REG.dataset(wc.dataset),
        root=lambda wc: P.selection.dataset_root(wc.dataset),
        images=P.images_settings,
    script:
        STAGE


rule duplicates:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        hashes=f"{R}/data/{{dataset}}/image_hashes.parquet",
    output:
        duplicates=f"{R}/data/{{dataset}}/duplicates.parquet",
    log:
        f"{R}/logs/duplicates/{{dataset}}.log",
    conda:
        CORE_ENV
    params:
        code=P.code("duplicates"),
        duplicates=config["duplicates"],
    script:
        STAGE


rule split:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        duplicates=f"{R}/data/{{dataset}}/duplicates.parquet",
    output:
        split=f"{R}/splits/{{dataset}}.parquet",
    log:
        f"{R}/logs/split/{{dataset}}.log",
    conda:
        CORE_ENV
    params:
        code=P.code("split"),
        split=config["split"],
        # every registry task of the dataset (not only the selected ones): one assignment whatever a config selects
        tasks=lambda wc: P.dataset_tasks(wc.dataset),
    script:
        STAGE


rule task_split:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        exclusions=f"{R}/data/{{dataset}}/exclusions.parquet",
        assignment=f"{R}/splits/{{dataset}}.parquet",
    output:
        split=f"{R}/splits/{{dataset}}/{{task}}.parquet",
    log:
        f"{R}/logs/split/{{dataset}}/{{task}}.log",
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
        hashes=[P.data(d, "image_hashes.parquet") for d in P.datasets],
        splits=[f"{R}/splits/{d}.parquet" for d in P.datasets],
    output:
        pairs=f"{R}/data/cross_dataset_duplicates.parquet",
    log:
        f"{R}/logs/duplicates/cross_dataset.log",
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
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
    output:
        **P.cache_files("{dataset}"),
    log:
        f"{R}/logs/image_cache/{{dataset}}.log",
    conda:
        CORE_ENV
    threads: 2
    resources:
        mem_mb=2000,
    params:
        code=P.code("image_cache"),
        image_cache=config["image_cache"],
        root=lambda wc: P.selection.dataset_root(wc.dataset),
    script:
        STAGE
