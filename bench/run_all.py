"""Run every benchmark and print its ratio or timing (`make bench`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import analysis_scale  # noqa: E402
import augment_throughput  # noqa: E402
import feature_throughput  # noqa: E402
import finetune_step  # noqa: E402
import mllm_scoring_overhead  # noqa: E402
import probe_cache_speedup  # noqa: E402

for bench in (feature_throughput, probe_cache_speedup, finetune_step, augment_throughput, analysis_scale, mllm_scoring_overhead):
    print(f"== {bench.__name__} ==")
    bench.main()
    print()
