"""bench/compute_gpu_check.py runs on a GPU machine; --smoke runs the same code and checks on two small CPU models
(the benchmark's own worker processes), so the script cannot rot between GPU runs."""
import json
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_compute_gpu_check_smoke_on_cpu(tmp_path):
    out = tmp_path / "compute.json"
    script = runpy.run_path(str(REPO / "bench/compute_gpu_check.py"), run_name="compute_gpu_check")
    assert script["main"](["--smoke", "--json", str(out)]) == 0  # every check passed
    rows = json.loads(out.read_text())
    assert {(r["encoder"], r["phase"]) for r in rows} == {(e, p) for e in ("vit_tiny_random", "resnet18_random")
                                                          for p in ("inference", "finetune", "linear_aug")}
    assert {r["device"] for r in rows} == {"cpu"} and {r["batch_size"] for r in rows} == {1, 4}
