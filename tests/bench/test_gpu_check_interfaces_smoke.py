"""bench/gpu_check_interfaces.py runs on a GPU machine; --smoke runs the same code (random registry architectures
built, saved, loaded through load_mllm / load_dual_encoder, driven through the protocol code) on tiny CPU configs."""
import json
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_interfaces_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_check_interfaces.json"
    script = runpy.run_path(str(REPO / "bench/gpu_check_interfaces.py"), run_name="gpu_check_interfaces")
    script["main"](["--smoke", "--device", "cpu", "--json", str(out)])
    report = json.loads(out.read_text())
    m, z = report["mllm"], report["zeroshot"]
    assert m["greedy_first_token_is_argmax"] and m["scores_finite"] and m["images"] == 4
    assert {"yes", "Yes", "no", "No"} <= set(m["answer_tokens"])
    assert m["ratio_best"] > 0 and m["dtype"] == "torch.float32"
    assert z["probabilities_ok"] and z["images"] == 8
