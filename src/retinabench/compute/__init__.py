"""Compute benchmark of encoders: inference latency and memory, training time per step and memory (full
fine-tuning and linear probing), parameters and FLOPs (OcularBench Figs. A.16-A.19)."""
from retinabench.compute.benchmark import (COMPUTE_COLUMNS, PHASES, benchmark_encoder, count_flops, measure_inference,
                                           measure_training)
from retinabench.compute.memory import PeakMemory, baseline_rss_mb, rss_mb

__all__ = ["COMPUTE_COLUMNS", "PHASES", "PeakMemory", "benchmark_encoder",
           "baseline_rss_mb", "count_flops", "measure_inference", "measure_training", "rss_mb"]
