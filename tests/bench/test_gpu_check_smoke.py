"""bench/gpu_check.py runs on a GPU machine; its --smoke mode runs the same code on tiny CPU models so that the
script cannot rot between GPU runs (in-process: the imports are shared with the suite)."""
import json
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_on_cpu(tmp_path, monkeypatch):
    out = tmp_path / "gpu_check.json"
    script = runpy.run_path(str(REPO / "bench/gpu_check.py"), run_name="gpu_check")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--smoke", "--device", "cpu", "--json", str(out)])
    script["main"]()
    report = json.loads(out.read_text())
    assert {r["model"] for r in report["throughput"]} == {"vit_b16", "efficientnet_lite0"}
    cnn = next(r for r in report["throughput"] if r["model"] == "efficientnet_lite0")
    vit = next(r for r in report["throughput"] if r["model"] == "vit_b16")
    assert cnn["pipeline_channels_last"] and not vit["pipeline_channels_last"]
    assert all(r["cosine_bf16_vs_fp32_min"] > 0.999 for r in report["throughput"])  # fp32 on CPU: equal
    assert report["giant"]["feature_batch"] == 32
