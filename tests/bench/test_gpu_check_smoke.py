"""bench/gpu_check.py runs on a GPU machine; its --smoke mode runs the same code on tiny CPU models so that the
script cannot rot between GPU runs."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/gpu_check.py"), "--smoke", "--device", "cpu",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {r["model"] for r in report["throughput"]} == {"vit_b16", "efficientnet_lite0"}
    cnn = next(r for r in report["throughput"] if r["model"] == "efficientnet_lite0")
    vit = next(r for r in report["throughput"] if r["model"] == "vit_b16")
    assert cnn["pipeline_channels_last"] and not vit["pipeline_channels_last"]
    assert all(r["cosine_bf16_vs_fp32_min"] > 0.999 for r in report["throughput"])  # fp32 on CPU: equal
    assert report["giant"]["feature_batch"] == 32
