"""Worker process of the compute benchmark: ``python -m retinabench.compute.worker SPEC.json OUT.json``.

Runs every phase of one encoder (``compute.benchmark.run_phases``) in a fresh interpreter and writes the rows as
JSON; any error exits non-zero with its traceback on stderr (the caller raises it)."""
import json
import sys
from pathlib import Path

from retinabench.atomic import write_text_atomic


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m retinabench.compute.worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    from retinabench.compute.benchmark import run_phases
    spec = json.loads(Path(argv[0]).read_text())
    rows = run_phases(spec)
    write_text_atomic(Path(argv[1]), json.dumps(rows, default=str))
    for r in rows:
        print(f"{r['encoder']} {r['phase']}: {r['seconds_median'] * 1e3:.2f} ms median (p90 "
              f"{r['seconds_p90'] * 1e3:.2f}) per batch of {r['batch_size']}, peak {r['peak_mem_mb']:.1f} MiB "
              f"({r['peak_mem_kind']}), {r['gflops']:.3f} GFLOPs/image, {r['device']} {r['dtype']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
