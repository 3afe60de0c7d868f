# Data stage: raw layout -> manifest + exclusions + decode pass -> duplicate clusters -> one split per dataset ->
# per-task views of it; image cache; duplicates across datasets.


GENERATED_ROOTS = {d["root"]: name for name, d in REG.datasets.items() if d.get("generated")}


rule phantom:
    output:
        metadata=os.path.join(PLAN.data_root, "{generated_root}", "metadata.csv"),
    params:
        stage="phantom",
        code=code_hash("data/phantom.py"),
        # The config's phantom settings, overridden per dataset by its registry `options`.
        phantom=lambda wc: {**PHANTOM_DEFAULTS, **config.get("phantom", {}),
                            **REG.dataset(GENERATED_ROOTS[wc.generated_root]).get("options", {})},
    wildcard_constraints:
        generated_root="|".join(map(re.escape, GENERATED_ROOTS)) or "(?!)",
    log:
        f"{R}/logs/phantom/{{generated_root}}.log",
    script:
        STAGE


rule manifest:
    input:
        index=lambda wc: [os.path.join(PLAN.dataset_root(wc.dataset), f)
                          for f in REG.dataset(wc.dataset)["index_files"]],
        fingerprint=lambda wc: raw_fingerprint(wc.dataset),
    output:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        exclusions=f"{R}/data/{{dataset}}/exclusions.parquet",
        hashes=f"{R}/data/{{dataset}}/image_hashes.parquet",
        raw_files=f"{R}/data/{{dataset}}/raw_files.parquet",
    params:
        stage="manifest",
        # Only this dataset's adapter and the helpers it imports: adding or editing another adapter reruns nothing.
        code=lambda wc: manifest_code_hash(REG.dataset(wc.dataset)["adapter"]),
        dataset=lambda wc: REG.dataset(wc.dataset),
        root=lambda wc: PLAN.dataset_root(wc.dataset),
    threads: 8
    log:
        f"{R}/logs/manifest/{{dataset}}.log",
    script:
        STAGE


rule duplicates:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        hashes=f"{R}/data/{{dataset}}/image_hashes.parquet",
    output:
        duplicates=f"{R}/data/{{dataset}}/duplicates.parquet",
    params:
        stage="duplicates",
        code=code_hash("data/duplicates.py"),
        duplicates=config["duplicates"],
    log:
        f"{R}/logs/duplicates/{{dataset}}.log",
    script:
        STAGE


rule split:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        duplicates=f"{R}/data/{{dataset}}/duplicates.parquet",
    output:
        split=f"{R}/splits/{{dataset}}.parquet",
    params:
        stage="split",
        code=code_hash("data/splits.py", "data/derived.py"),
        split=config["split"],
        # every registry task of the dataset (not only the selected ones): one assignment whatever a config selects
        tasks=lambda wc: dataset_tasks(REG, wc.dataset),
    log:
        f"{R}/logs/split/{{dataset}}.log",
    script:
        STAGE


rule task_split:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        exclusions=f"{R}/data/{{dataset}}/exclusions.parquet",
        assignment=f"{R}/splits/{{dataset}}.parquet",
    output:
        split=f"{R}/splits/{{dataset}}/{{task}}.parquet",
    params:
        stage="task_split",
        code=code_hash("data/splits.py", "data/derived.py"),
        task=lambda wc: REG.task(wc.task),
        seed=config["split"]["seed"],
    log:
        f"{R}/logs/split/{{dataset}}/{{task}}.log",
    script:
        STAGE


rule cross_duplicates:
    input:
        hashes=[f"{R}/data/{d}/image_hashes.parquet" for d in PLAN.datasets],
        splits=[f"{R}/splits/{d}.parquet" for d in PLAN.datasets],
    output:
        pairs=f"{R}/data/cross_dataset_duplicates.parquet",
    params:
        stage="cross_duplicates",
        code=code_hash("data/duplicates.py"),
        duplicates=config["duplicates"],
        datasets=PLAN.datasets,
    log:
        f"{R}/logs/duplicates/cross_dataset.log",
    script:
        STAGE


rule image_cache:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
    output:
        array=f"{R}/data/{{dataset}}/images_{CACHE_TAG}.npy",
        index=f"{R}/data/{{dataset}}/images_{CACHE_TAG}.index.parquet",
    params:
        stage="image_cache",
        code=code_hash("data/image_cache.py"),
        image_cache=config["image_cache"],
        root=lambda wc: PLAN.dataset_root(wc.dataset),
    threads: 2
    resources:
        mem_mb=2000,
    log:
        f"{R}/logs/image_cache/{{dataset}}.log",
    script:
        STAGE
