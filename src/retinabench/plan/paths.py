"""Every artifact path of a run, declared once: a pattern under the results folder with ``{wildcards}``.

The rule files ask the plan for a path by name (``P.path("features")`` is the wildcard pattern a rule outputs;
``P.path("features", encoder=e, dataset=d)`` one file), the plan's input functions and target lists use the same
table, and ``retinabench targets`` reads the wildcards back out of a path (:meth:`Paths.values`). A value not
given stays a wildcard, so one pattern serves the rule and its consumers. Logs are named by rule (``LOGS``).
"""
from __future__ import annotations

import re
import string
from functools import cache

__all__ = ["LOGS", "PATHS", "Paths", "wildcards"]

# name -> pattern under the results folder. Wildcards: dataset, task, encoder, source (a predictions source: frozen,
# transfer, a fine-tuning protocol, an interface, mllm_lora), name (a task, transfer group or task set), protocol,
# seed, stage, kind, ext, table, figure, generated_root, cache_tag (the image cache's size_resize), variant (a
# protocol-sensitivity feature variant: <convention>-<value>).
PATHS: dict[str, str] = {
    # data (workflow/rules/data.smk)
    "phantom_metadata": "raw/{generated_root}/metadata.csv",
    "dataset_folder": "data/{dataset}",
    "manifest": "data/{dataset}/manifest.parquet",
    "exclusions": "data/{dataset}/exclusions.parquet",
    "image_hashes": "data/{dataset}/image_hashes.parquet",
    "raw_files": "data/{dataset}/raw_files.parquet",
    "duplicates": "data/{dataset}/duplicates.parquet",
    "cross_duplicates": "data/cross_dataset_duplicates.parquet",
    "image_cache": "data/{dataset}/images_{cache_tag}.npy",
    "image_cache_index": "data/{dataset}/images_{cache_tag}.index.parquet",
    "assignment": "splits/{dataset}.parquet",
    "task_split": "splits/{dataset}/{task}.parquet",
    "tiny_model": "tiny_models/{name}",
    # features and every protocol's per-job tables (features.smk, probes.smk, finetune.smk, interfaces.smk, ...)
    "features": "features/{encoder}/{dataset}.parquet",
    "predictions": "predictions/{source}/{encoder}/{name}.parquet",
    "job_metrics": "metrics/{source}/{encoder}/{name}.parquet",
    "training_log": "training_logs/{source}/{encoder}/{name}.parquet",
    # fine-tuning and the learning-rate sweep (finetune.smk, saliency.smk)
    "finetune_run": "{kind}/{protocol}/{encoder}/{task}/seed{seed}.{ext}",
    "finetune_checkpoints": "checkpoints/{protocol}/{encoder}/{task}/seed{seed}",
    "finetune_compute": "compute/finetune.parquet",
    "model_weights": "models/{protocol}/{encoder}/{task}/seed{seed}.pt",
    "sweep_stage": "sweep/{encoder}/{task}/stage{stage}_{kind}.parquet",
    "sweep_checkpoints": "checkpoints/sweep/{encoder}/{task}/stage{stage}",
    "sweep_chosen": "sweep/{encoder}/chosen.json",
    "sweep_sensitivity": "sweep/{encoder}/sensitivity.parquet",
    "lr_sweep_metrics": "sweep/lr_sweep_metrics.parquet",
    "lr_sensitivity": "sweep/lr_sensitivity.parquet",
    # prompt-based interfaces and LoRA (interfaces.smk, lora.smk)
    "interface_table": "interfaces/{table}.parquet",
    "lora_run": "lora/{encoder}/{task}",
    "lora_adapter": "lora/{encoder}/{task}/adapter",
    "lora_train_log": "lora/{encoder}/{task}/train_log.parquet",
    "lora_compute": "lora/{encoder}/{task}/compute.json",
    "lora_delta": "lora/deltas/{table}.parquet",
    "lora_table5": "lora/deltas/table5.csv",
    "lora_figure": "figures/lora/table5.{ext}",
    # reliability (reliability.smk)
    "reliability_job": "reliability/jobs/{source}/{encoder}/{name}/{kind}.parquet",
    "reliability_table": "reliability/{table}.parquet",
    "reliability_figure": "figures/reliability/{figure}",
    # protocol sensitivity (reliability.smk): the other value's features, the table, the figure folder
    "sensitivity_features": "sensitivity/features/{variant}/{encoder}/{dataset}.parquet",
    "sensitivity_table": "reliability/protocol_sensitivity.parquet",
    "sensitivity_figure": "figures/protocol_sensitivity",
    "focus_table": "reliability/focus/{table}.{ext}",
    "focus_figure": "figures/focus/{figure}.{ext}",
    # analysis (analysis.smk): the metrics table, statistics, figures and tables of the families
    "metrics": "metrics.parquet",
    "metrics_csv": "metrics.csv",
    "analysis_table": "analysis/{table}.{ext}",
    "figure": "figures/{figure}.{ext}",
    "report_table": "tables/{table}.{ext}",
    "baselines": "analysis/baselines.csv",
    "skipped_analyses": "skipped_analyses.csv",
    # saliency and compute (saliency.smk, compute.smk)
    "saliency": "saliency/{encoder}/{task}.{ext}",
    "saliency_figure": "figures/saliency/{task}.{ext}",
    "compute_benchmark": "compute/benchmark/{encoder}.parquet",
    "compute_table": "compute/benchmark.parquet",
    "compute_figure": "figures/compute/{figure}.{ext}",
}

# rule -> its log under the results folder (the analysis families: rule "analysis" with wildcard family)
LOGS: dict[str, str] = {
    "phantom": "logs/phantom/{generated_root}.log",
    "manifest": "logs/manifest/{dataset}.log",
    "duplicates": "logs/duplicates/{dataset}.log",
    "split": "logs/split/{dataset}.log",
    "task_split": "logs/split/{dataset}/{task}.log",
    "cross_duplicates": "logs/duplicates/cross_dataset.log",
    "image_cache": "logs/image_cache/{dataset}.log",
    "features": "logs/features/{encoder}/{dataset}.log",
    "frozen": "logs/frozen/{encoder}/{task}.log",
    "finetune": "logs/finetune/{protocol}/{encoder}/{task}/seed{seed}.log",
    "finetune_predictions": "logs/finetune_predictions/{protocol}/{encoder}/{task}.log",
    "finetune_compute": "logs/finetune_compute.log",
    "sweep_linear": "logs/sweep/{encoder}/{task}/stage1.log",
    "sweep_finetune": "logs/sweep/{encoder}/{task}/stage2.log",
    "sweep_choose": "logs/sweep/{encoder}/choose.log",
    "sweep_sensitivity": "logs/sweep/{encoder}/sensitivity.log",
    "sweep_collect": "logs/sweep/collect.log",
    "zeroshot": "logs/zeroshot/{encoder}/{task_set}.log",
    "mllm": "logs/mllm/{encoder}/{task_set}.log",
    "interface_tables": "logs/interfaces/tables.log",
    "tiny_model": "logs/tiny_models/{name}.log",
    "mllm_lora_train": "logs/mllm_lora_train/{encoder}/{task}.log",
    "mllm_lora_infer": "logs/mllm_lora_infer/{encoder}/{task}.log",
    "mllm_lora_deltas": "logs/mllm_lora_deltas.log",
    "transfer": "logs/transfer/{encoder}/{group}.log",
    "reliability": "logs/reliability/{source}/{encoder}/{name}.log",
    "reliability_collect": "logs/reliability/collect.log",
    "reliability_paired": "logs/reliability/paired.log",
    "reliability_figure": "logs/figures/reliability/{figure}.log",
    "protocol_sensitivity_features": "logs/protocol_sensitivity/features/{variant}/{encoder}/{dataset}.log",
    "protocol_sensitivity": "logs/reliability/protocol_sensitivity.log",
    "protocol_sensitivity_figure": "logs/figures/protocol_sensitivity.log",
    "focus_tables": "logs/reliability/focus_tables.log",
    "focus_figure": "logs/figures/focus/{figure}.log",
    "collect_metrics": "logs/collect_metrics.log",
    "analysis": "logs/analysis/{family}.log",
    "baselines": "logs/analysis/baselines.log",
    "skipped_analyses": "logs/analysis/skipped_analyses.log",
    "saliency": "logs/saliency/{encoder}/{task}.log",
    "figure_saliency": "logs/figures/saliency/{task}.log",
    "compute_benchmark": "logs/compute/{encoder}.log",
    "compute_collect": "logs/compute/collect.log",
    "figure_compute": "logs/figures/compute.log",
}


def wildcards(pattern: str) -> list[str]:
    """The wildcard names of a pattern, in order."""
    return list(_wildcards(pattern))


@cache
def _wildcards(pattern: str) -> tuple[str, ...]:  # asked ~150k times by a paper grid's dry run, for ~60 patterns
    return tuple(f for _, f, _, _ in string.Formatter().parse(pattern) if f)


class _Keep(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class Paths:
    """The table bound to one results folder (and fixed values such as the image cache's ``cache_tag``)."""

    def __init__(self, results: str, **fixed: str):
        self.results, self.fixed = results, fixed

    def _pattern(self, table: dict[str, str], name: str, what: str) -> str:
        if name not in table:
            raise KeyError(f"no {what} {name!r} in retinabench.plan.paths (known: {sorted(table)})")
        return f"{self.results}/{table[name]}"

    def path(self, artifact: str, /, **values) -> str:
        """The path of ``artifact`` with ``values`` filled in; a wildcard not given stays ``{wildcard}``."""
        unknown = set(values).difference(_wildcards(PATHS.get(artifact, "")))
        if artifact in PATHS and unknown:
            raise KeyError(f"path {artifact!r} ({PATHS[artifact]}) has no wildcard(s) {sorted(unknown)}")
        return self._pattern(PATHS, artifact, "path").format_map(_Keep({**self.fixed, **values}))

    def log(self, rule: str, /, **values) -> str:
        """The log of a rule's job (wildcards not given stay wildcards)."""
        return self._pattern(LOGS, rule, "log").format_map(_Keep({**self.fixed, **values}))

    def values(self, artifact: str, path: str) -> dict[str, str] | None:
        """The wildcard values of ``path`` if it is an instance of ``artifact``'s pattern (else None)."""
        pattern = self._pattern(PATHS, artifact, "path").format_map(_Keep(self.fixed))
        regex, seen = "", set()
        for literal, field, _, _ in string.Formatter().parse(pattern):
            regex += re.escape(literal)
            if field:
                regex += f"(?P={field})" if field in seen else f"(?P<{field}>.+?)"
                seen.add(field)
        m = re.fullmatch(regex, path)
        return m.groupdict() if m else None
