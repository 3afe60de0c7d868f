"""The LoRA training job as a torchrun process group on CPU (gloo): two processes train one adapter (rank 0 writes
it, its sidecar, the loss log and the compute record). Ours: the gradient accumulation is divided by the world size
so the effective batch stays the configured one, LoRA on the language model only; FOCUS's variant: batch x
accumulation per process (effective x 2), LoRA on the vision tower's and the language model's linears plus lm_head /
embed_tokens in full. A failing group fails the job with its last lines, and the process count follows the job's
GPUs."""
import json

import pytest

from retinabench.protocols import lora_launch
from retinabench.models.adapters import load_adapter, verify_adapter_files
from retinabench.protocols.lora import LoraSettings
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # trains real models / starts process groups: left out of make test-fast

TASK = {"name": "phantom_cfp_glaucoma", "dataset": "phantom", "modality": "cfp", "label": "glaucoma",
        "classes": ["no", "yes"], "ordinal": False, "harmonised": "gon"}
SETTINGS = {"lr": 5e-3, "max_steps": 4, "batch_size": 2, "grad_accum": 2, "save_steps": 2}


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    """A training job's spec over real files: the phantom's manifest, split, image cache and a tiny LLaVA."""
    from retinabench.data.adapters.phantom import adapt_phantom
    from retinabench.data.image_cache import build_image_cache
    from retinabench.data.phantom import generate_phantom
    from retinabench.data.splits import make_split
    from retinabench.schemas import write_table
    from retinabench.models.tiny import build_tiny_llava
    root = tmp_path_factory.mktemp("lora_launch")
    generate_phantom(root / "phantom", n_patients=24, image_size=64, seed=0)
    man, _ = adapt_phantom(root / "phantom", {"name": "phantom"})
    write_table(man, root / "manifest.parquet", "manifest")
    write_table(make_split(man, TASK), root / "split.parquet", "split")
    build_image_cache(man, root / "phantom", root / "images.npy", root / "index.parquet", size=32, resize="squash",
                      progress=False)
    entry = build_tiny_llava(root / "llava")
    inputs = {"array": str(root / "images.npy"), "index": str(root / "index.parquet"),
              "manifest": str(root / "manifest.parquet"), "split": str(root / "split.parquet"),
              "prompts": str(REPO / "config/prompts.yaml")}
    return {"entry": entry, "task": TASK, "weights": str(root / "llava"), "device": "cpu", "dtype": "float32",
            "threads": 2, "settings": SETTINGS, "inputs": inputs, "root": root,
            "provenance_inputs": [inputs["split"], inputs["manifest"]], "wildcards": {"task": TASK["name"]}}


def test_two_processes_train_one_adapter_with_the_effective_batch_kept(spec):
    out = spec["root"] / "group"
    s = {**spec, "root": None, "out_dir": str(out)}
    assert lora_launch.launch(s, 2, log=lambda m: None) is None
    compute = json.loads((out / "compute.json").read_text())
    assert compute["world_size"] == 2 and compute["batch_size"] == 2
    # 2 processes x batch 2 x accumulation 1 = the configured 2 x 2
    assert compute["grad_accum"] == 1 and compute["effective_batch"] == 4 and compute["steps"] == 4
    assert set(_adapted(out)) and all(n.startswith("model.language_model.") for n in _adapted(out))  # LM only
    assert compute["memory_estimate"]["world_size"] == 2 and compute["memory_estimate"]["saved_module_params"] == 0
    info = verify_adapter_files(out / "adapter")  # rank 0 wrote the sidecar with every file's sha256
    assert info.task == TASK["name"] and info.record["world_size"] == 2
    assert not (out / "checkpoints").exists()
    from retinabench.models.mllm import load_mllm
    m = load_adapter(load_mllm(spec["entry"], spec["weights"], device="cpu"), out / "adapter")
    assert m.weights["adapter"]["sha256"] == info.sha256


def _adapted(out) -> set[str]:
    """The module names the saved adapter holds LoRA weights for (and its full copies, as '<module>:full')."""
    from safetensors import safe_open
    with safe_open(str(out / "adapter" / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    stems = {k.removeprefix("base_model.model.") for k in keys}
    return ({k.rsplit(".lora_", 1)[0] for k in stems if ".lora_" in k}
            | {k.rsplit(".", 1)[0] + ":full" for k in stems if ".lora_" not in k})


def test_two_processes_train_focus_variant_all_linear_with_the_batch_per_process(spec):
    out = spec["root"] / "focus"
    focus = {**SETTINGS, "max_steps": 2, "targets": "all_linear", "modules_to_save": "focus", "label_mask": "full",
             "effective_batch": "per_process"}
    logs: list[str] = []
    s = {**spec, "root": None, "out_dir": str(out), "settings": focus}
    assert lora_launch.launch(s, 2, log=logs.append) is None
    compute = json.loads((out / "compute.json").read_text())
    # FOCUS: every process runs batch x accumulation: 2 processes x 2 x 2 = 8 (4 GPUs x 4 x 4 = 64 on its cluster)
    assert (compute["world_size"], compute["batch_size"], compute["grad_accum"]) == (2, 2, 2)
    assert compute["effective_batch"] == 8 and compute["steps"] == 2
    adapted = _adapted(out)
    assert {n for n in adapted if n.startswith("model.vision_tower.")}            # the vision tower's linears
    assert {n for n in adapted if n.startswith("model.language_model.layers.")}   # and the language model's
    assert {"lm_head:full", "model.language_model.embed_tokens:full"} <= adapted   # modules_to_save
    est = compute["memory_estimate"]
    assert est["saved_module_params"] > 0 and est["ddp_bucket_bytes"] == est["gradient_bytes"] > 0
    assert any("[rank 0]" in m and "memory estimate per process (ddp, 2 process(es)" in m for m in logs)
    assert not any("[rank 1]" in m and "memory estimate" in m for m in logs)  # rank 0 logs it, once


def test_a_failing_group_fails_the_job_with_its_last_lines(spec, tmp_path):
    bad = {**spec, "root": None, "out_dir": str(tmp_path / "out"),
           "inputs": {**spec["inputs"], "split": str(tmp_path / "missing.parquet")}}
    with pytest.raises(RuntimeError, match=r"(?s)group of 2 processes failed.*missing\.parquet"):
        lora_launch.launch(bad, 2, log=lambda m: None)
    assert not (tmp_path / "out" / "adapter").exists()


def test_accumulation_is_divided_by_the_world_size_and_must_divide():
    s = LoraSettings()
    assert s.per_process({"params_m": 8000}, 1) == (4, 4) and s.per_process({"params_m": 8000}, 4) == (4, 1)
    assert s.per_process({"params_m": 27000}, 4) == (1, 2)        # 27B class: 1 x 8 over 4 GPUs
    with pytest.raises(ValueError, match="not divisible by the 3 processes"):
        s.per_process({"params_m": 8000}, 3)
    focus = LoraSettings(effective_batch="per_process")
    assert focus.per_process({"params_m": 8000}, 3) == (4, 4)
    assert focus.per_process({"params_m": 8000}, 4) == (4, 4)    # FOCUS: 4 x 4 x 4 GPUs = 64
    assert focus.per_process({"params_m": 27000}, 4) == (1, 8)   # 27B class: 1 x 8 x 4 GPUs = 32


def test_process_count_follows_the_setting_and_the_visible_gpus(monkeypatch):
    import torch
    assert lora_launch.processes(3, 4) == 3
    with pytest.raises(ValueError, match="lora.processes"):
        lora_launch.processes(0, 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert lora_launch.processes("auto", 4) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert lora_launch.processes("auto", 4) == 4                   # never more than the job holds
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert lora_launch.local_device("auto") == "cuda:3" and lora_launch.local_device("cpu") == "cpu"
