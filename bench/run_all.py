"""Run every benchmark and print its ratio (`make bench`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import feature_throughput  # noqa: E402
import probe_cache_speedup  # noqa: E402

feature_throughput.main()
print()
probe_cache_speedup.main()
