"""The analysis layer (statistics, figures, tables).

The analysis is organised in *families*, one Snakemake job each (never one per task): ``ranks``, ``rank_figures``,
``tables``, ``cd`` (Friedman / Nemenyi / critical-difference diagrams), ``protocol_heatmap``, ``agreement``
(Spearman), ``distance`` (signed rank distances + Kruskal–Wallis across the paper's encoder groups), ``subsets``,
``leakage``, ``top_k``, ``attributes`` (Table 1: sensitive attributes per dataset), ``ft_lp``, ``fairness``,
``sensitivity`` and ``lr_transfer``. Figures comparing protocols show OcularBench's three (kNN, its linear probe,
full fine-tuning) when two or more are ranked; the project's other probes go to ``*_extended`` figures
(:attr:`AnalysisContext.protocol_sets`).

Each analysis runs on the protocol the paper used. The *analysis protocol* of the main rank figure, the CD
diagrams, the subset / leakage / top-k / fairness analyses is full fine-tuning (``analysis.finetune_protocol``)
when the config ranks it (it covers every encoder, task and regime), otherwise ``analysis.fallback_protocol``;
titles and tables name it and, for a fallback, why (:func:`choose_headline`). The FT − LP gap compares fine-tuning
with the paper's linear probe ``linear_aug`` (frozen encoder, same trainer, augmentations, swept lr). The fairness
family reads the reliability layer's subgroup table (``reliability/subgroup_metrics.parquet``) by default. Which
families this config can produce and their output paths is the plan's decision
(:func:`retinabench.plan.family_outputs.analysis_outputs`); the Snakemake rules, the benchmark and the tests all use it.
Modules: :mod:`.context` (what the analysis reads from the config and registries), :mod:`.families`
(each family a plain function ``family_x(inputs, ctx, out)``, DataFrames in, files out; :mod:`.attributes` holds
Table 1's, :mod:`.common` the writers they share). The stages are in retinabench.pipeline.analysis.
"""
from retinabench.analysis.context import FAMILIES, AnalysisContext, Family, choose_headline

__all__ = ["FAMILIES", "AnalysisContext", "Family", "choose_headline"]
