"""Reliability of any predictions table (same schema for probes, fine-tuning, zero-shot, MLLMs): calibration,
thresholds, fairness and quality gaps, coverage of harmonised tasks, summary scores, paired comparisons."""
from retinabench.reliability.evaluation import (ATTRIBUTE_COLUMNS, AS_WRITTEN, CELL_KEYS, KINDS, UNIT_KEYS,
                                                attach_manifest, attributes_of, decisions, evaluate_predictions,
                                                prepare_predictions, resampling_units, table_columns)
from retinabench.reliability.paired import MODEL_KEYS, comparison_pairs, paired_comparisons
from retinabench.reliability.scores import analysis_subgroup_metrics, harmonised_coverage, summary_scores

__all__ = ["ATTRIBUTE_COLUMNS", "AS_WRITTEN", "CELL_KEYS", "KINDS", "MODEL_KEYS", "UNIT_KEYS",
           "analysis_subgroup_metrics", "attach_manifest", "attributes_of", "comparison_pairs", "decisions",
           "evaluate_predictions", "harmonised_coverage", "paired_comparisons", "prepare_predictions",
           "resampling_units", "summary_scores", "table_columns"]
