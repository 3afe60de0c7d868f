# Features stage: one job per (encoder, dataset). The encoder entry is a param, so editing it reruns exactly
# that encoder's features (Snakemake's params rerun trigger); a new preprocessing changes the cache path.


rule features:
    input:
        unpack(P.feature_inputs),
    output:
        features=P.path("features"),
    log:
        P.log("features"),
    conda:
        TORCH_ENV
    threads: 2
    resources:
        mem_mb=P.encoder_resource("mem_mb"),
        runtime=P.encoder_resource("runtime"),
        gpu=P.encoder_resource("gpu"),
    params:
        code=P.code("features"),
        encoder=lambda wc: REG.encoder(wc.encoder),
        features=P.feature_settings,
    script:
        STAGE
