# Analysis stage: one tidy metrics table, encoder ranks, figures.


def analysis_targets():
    """Analysis outputs requested by `all` (only those whose inputs this config produces)."""
    return []


rule collect_metrics:
    input:
        metrics=all_metrics_files(),
    output:
        metrics=f"{R}/metrics.parquet",
        csv=f"{R}/metrics.csv",
    params:
        stage="collect_metrics",
    log:
        f"{R}/logs/collect_metrics.log",
    script:
        STAGE


rule ranks:
    input:
        metrics=f"{R}/metrics.parquet",
    output:
        ranks=f"{R}/analysis/ranks.parquet",
        summary=f"{R}/analysis/rank_summary.csv",
    params:
        stage="ranks",
        code=code_hash("stats"),
        ranking=config["ranking"],
    log:
        f"{R}/logs/ranks.log",
    script:
        STAGE


rule figure_rank_distribution:
    input:
        ranks=f"{R}/analysis/ranks.parquet",
    output:
        png=f"{R}/figures/rank_distribution.png",
        pdf=f"{R}/figures/rank_distribution.pdf",
    params:
        stage="figure_rank_distribution",
        code=code_hash("figures"),
        ranking=config["ranking"],
        encoders=lambda wc: {e: REG.encoder(e) for e in PLAN.encoders},
    log:
        f"{R}/logs/figures/rank_distribution.log",
    script:
        STAGE
