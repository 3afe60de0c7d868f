# Features stage: one job per (encoder, dataset). The encoder entry is a param, so editing it reruns exactly
# that encoder's features (Snakemake's params rerun trigger); a new preprocessing changes the cache path.


rule features:
    input:
        unpack(lambda wc: cache_files(wc.dataset)),
    output:
        features=f"{R}/features/{{encoder}}/{{dataset}}.parquet",
    log:
        f"{R}/logs/features/{{encoder}}/{{dataset}}.log",
    conda:
        TORCH_ENV
    threads: 2
    resources:
        mem_mb=encoder_resource("mem_mb"),
        runtime=encoder_resource("runtime"),
        gpu=encoder_resource("gpu"),
    params:
        code=code_hash("models", "features"),
        encoder=lambda wc: REG.encoder(wc.encoder),
        features=feature_settings,
    script:
        STAGE
