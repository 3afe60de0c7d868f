"""bench/gpu_check_lora.py runs on a GPU machine; --smoke runs the same code (a random Qwen3-VL architecture built,
saved, loaded through load_mllm, LoRA-trained through train_lora, reloaded strictly and answering) on CPU."""
import json
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_lora_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_check_lora.json"
    script = runpy.run_path(str(REPO / "bench/gpu_check_lora.py"), run_name="gpu_check_lora")
    script["main"](["--smoke", "--device", "cpu", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["steps"] == 2 and r["loss_finite"] and r["trainable_params_m"] > 0
    assert not r["bf16"] and not r["gradient_checkpointing"]       # CPU: fp32, no checkpointing
    assert r["answers"] == 2 and r["max_prob_yes_change"] > 0 and r["adapter_mb"] > 0
