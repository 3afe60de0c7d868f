# Data stage: raw layout -> manifest + exclusions -> patient-disjoint splits; image cache.


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
    output:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        exclusions=f"{R}/data/{{dataset}}/exclusions.parquet",
    params:
        stage="manifest",
        code=code_hash("data/adapters"),
        dataset=lambda wc: REG.dataset(wc.dataset),
        root=lambda wc: PLAN.dataset_root(wc.dataset),
    threads: 2
    log:
        f"{R}/logs/manifest/{{dataset}}.log",
    script:
        STAGE


rule split:
    input:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        exclusions=f"{R}/data/{{dataset}}/exclusions.parquet",
    output:
        split=f"{R}/splits/{{dataset}}/{{task}}.parquet",
    params:
        stage="split",
        code=code_hash("data/splits.py", "data/derived.py"),
        task=lambda wc: REG.task(wc.task),
        split=config["split"],
    log:
        f"{R}/logs/split/{{dataset}}/{{task}}.log",
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
