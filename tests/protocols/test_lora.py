"""LoRA SFT of a tiny random LLaVA on the phantom: settings, label mask, training (loss falls, adapter saved with
its sidecar), strict reloading (changes the answers; a wrong / altered / mismatched adapter fails), the adapter
inference path = the base path, and the paired-delta table with in-domain and out-of-domain rows
(phantom -> phantom_siteb). One training run serves every test."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from retinabench.models import adapters as A
from retinabench.models import load_mllm
from retinabench.prompts import load_prompts
from retinabench.protocols import lora as L
from retinabench.protocols import mllm as M
from retinabench.protocols.mllm import run_mllm
from retinabench.provenance import read_sidecar
from tests.conftest import REPO

TASKS = {
    "phantom_cfp_glaucoma": {"name": "phantom_cfp_glaucoma", "dataset": "phantom", "modality": "cfp",
                             "label": "glaucoma", "classes": ["no", "yes"], "ordinal": False, "harmonised": "gon"},
    "phantom_siteb_cfp_glaucoma": {"name": "phantom_siteb_cfp_glaucoma", "dataset": "phantom_siteb",
                                   "modality": "cfp", "label": "glaucoma", "classes": ["no", "yes"],
                                   "ordinal": False, "harmonised": "gon"},
}
SOURCE = TASKS["phantom_cfp_glaucoma"]
FAST = dict(lr=5e-3, max_steps=6, batch_size=4, grad_accum=1, save_steps=2)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two small phantom sites (64-px images read at 32 px), their manifests and splits."""
    from retinabench.data.adapters.phantom import adapt_phantom
    from retinabench.data.phantom import generate_phantom
    from retinabench.data.splits import make_split
    root = tmp_path_factory.mktemp("lora_phantom")
    sites = {"phantom": dict(seed=0, sites=None),
             "phantom_siteb": dict(seed=1, sites=[{"name": "B", "color_cast": [1.12, 0.92, 0.78], "blur": 1.0,
                                                   "vignetting": 0.35, "resolution": 0.6, "fraction": 1.0}])}
    manifests, images, ids = [], [], []
    for name, opt in sites.items():
        generate_phantom(root / name, n_patients=28, image_size=64, **opt)
        man, _ = adapt_phantom(root / name, {"name": name})
        manifests.append(man)
        cfp = man[man["modality"] == "cfp"]
        images += [np.asarray(Image.open(root / name / p).convert("RGB").resize((32, 32))) for p in cfp["path"]]
        ids += list(cfp["image_id"])
    manifest = pd.concat(manifests, ignore_index=True)
    splits = {t: make_split(manifest[manifest["dataset"] == task["dataset"]], task) for t, task in TASKS.items()}
    return {"manifest": manifest, "images": np.stack(images), "ids": ids, "splits": splits}


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(REPO / "config/prompts.yaml")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from retinabench.models.tiny import build_tiny_llava
    folder = tmp_path_factory.mktemp("lora_base") / "tiny_llava"
    return build_tiny_llava(folder), folder


def _load(base):
    entry, folder = base
    return load_mllm(entry, folder)


@pytest.fixture(scope="module")
def trained(world, prompts, base, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("lora_run")
    settings = L.LoraSettings(**FAST)
    m = _load(base)
    examples, prompt = L.training_examples(world["images"], world["ids"], world["manifest"],
                                           world["splits"][SOURCE["name"]], SOURCE, prompts, settings)
    rec = L.train_lora(m, examples, prompt, out, settings, entry=base[0], task=SOURCE)
    A.write_adapter_sidecar(rec["adapter"], rec)
    return {"record": rec, "out": out, "examples": examples, "prompt": prompt, "settings": settings}


@pytest.fixture(scope="module")
def predictions(world, prompts, base, trained):
    """Base and adapter predictions on both test sets through run_mllm (one prompt set)."""
    base_frames, adapter_frames = [], []
    m0 = _load(base)
    ma = A.load_adapter(_load(base), trained["record"]["adapter"])
    for t, task in TASKS.items():
        args = (world["images"], world["ids"], world["manifest"], world["splits"][t], task, prompts)
        base_frames.append(run_mllm(m0, *args, prompt_sets=["focus"]))
        adapter_frames.append(M.adapter_predictions(run_mllm(ma, *args, prompt_sets=["focus"]), ma))
    return pd.concat(base_frames, ignore_index=True), pd.concat(adapter_frames, ignore_index=True)


# --- settings ---------------------------------------------------------------------------------------------------
def test_settings_default_to_focus_and_reject_unknown_keys():
    from retinabench.settings import ConfigError, LoraSection
    s = LoraSection.from_config({"lora": {}}).train
    assert (s.r, s.alpha, s.dropout, s.bias, s.epochs, s.lr) == (16, 16, 0.05, "none", 1.0, 2e-5)
    assert s.batching({"params_m": 8355.3}) == (4, 4)          # LLaVA-NeXT-8B
    assert s.batching({"params_m": 27447.6}) == (1, 8)         # Gemma-3-27B / MedGemma-27B
    assert s.label_mask == "answer" and s.precision == "auto" and s.gradient_checkpointing == "auto"
    with pytest.raises(ConfigError, match="lora.train.rank: unknown key"):
        LoraSection.from_config({"lora": {"train": {"rank": 8}}})
    with pytest.raises(ConfigError, match="lora.train.bias: Input should be 'none'"):
        L.LoraSettings.of({"bias": "all"}, "lora.train")
    assert L._resolve_precision(s, torch.device("cuda")) == (True, True)
    assert L._resolve_precision(s, torch.device("cpu")) == (False, False)


def test_lora_targets_every_language_model_linear_and_nothing_else(base):
    m = _load(base)
    names = L.language_model_linears(m.model)
    assert len(names) == 2 * 7 and all(n.startswith("model.language_model.layers.") for n in names)
    assert not any("vision_tower" in n or "projector" in n or n == "lm_head" for n in names)
    m2 = load_mllm(*_qwen())
    assert all(n.startswith("model.language_model.") for n in L.language_model_linears(m2.model))


def test_all_linear_is_peft_all_linear_with_the_vision_tower_and_without_lm_head(base):
    from peft import LoraConfig, get_peft_model
    for m in (_load(base), load_mllm(*_qwen())):
        ours = set(L.target_linears(m.model, "all_linear"))
        lm = set(L.target_linears(m.model, "language_model"))
        assert lm < ours and "lm_head" not in ours
        vision = {n for n in ours if n.startswith(("model.vision_tower.", "model.visual."))}
        assert vision and all(n.startswith(("model.vision_tower.", "model.visual.", "model.multi_modal_projector."))
                              for n in ours - lm)  # the vision tower and the projector / merger
        peft = get_peft_model(load_mllm(*(base if m.name == "tiny_llava" else _qwen())).model,
                              LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
        wrapped = {n.removeprefix("base_model.model.") for n, mod in peft.named_modules() if hasattr(mod, "lora_A")}
        assert wrapped == ours  # peft's own resolution of "all-linear"


def test_focus_modules_to_save_except_a_pure_llama():
    focus = L.LoraSettings(modules_to_save="focus")
    assert L.modules_to_save(focus, {"hub_id": "llava-hf/llama3-llava-next-8b-hf"}) == ["lm_head", "embed_tokens"]
    assert L.modules_to_save(focus, {"hub_id": "meta-llama/Llama-3.2-11B-Vision-Instruct"}) is None
    assert L.modules_to_save(L.LoraSettings(), {"hub_id": "google/medgemma-4b-it"}) is None
    with pytest.raises(ValueError, match="language_model or all_linear"):
        L.target_linears(torch.nn.Linear(2, 2), "everything")


def test_memory_estimate_counts_parameter_bytes_exactly(base):
    from peft import get_peft_model

    from retinabench.protocols.lora_memory import GIB, describe, memory_estimate
    m = _load(base)
    s = L.LoraSettings(targets="all_linear", modules_to_save="focus")
    mods = dict(m.model.named_modules())
    n_lora = sum(16 * (mods[n].in_features + mods[n].out_features) for n in L.target_linears(m.model, "all_linear"))
    peft = get_peft_model(m.model, L.lora_config(s, m.model, base[0]))
    frozen = sum(p.numel() * p.element_size() for p in peft.parameters() if not p.requires_grad)
    train = sum(p.numel() * p.element_size() for p in peft.parameters() if p.requires_grad)
    est = memory_estimate(peft, batch=2, seq_len=40, world_size=4, strategy="ddp", vision_tokens=16)
    assert est["frozen_bytes"] == frozen and est["trainable_bytes"] == train and est["lora_params"] == n_lora
    assert est["saved_module_params"] > 0 and est["lora_bytes"] == 4 * n_lora  # fp32 LoRA matrices
    assert est["gradient_bytes"] == train and est["optimizer_bytes"] == 2 * train and est["ddp_bucket_bytes"] == train
    t = m.model.config.text_config
    assert est["activation_bytes"] >= 2 * 40 * t.hidden_size * t.num_hidden_layers * 2 + 2 * 2 * 40 * t.vocab_size * 4
    fsdp = memory_estimate(peft, batch=2, seq_len=40, world_size=4, strategy="fsdp")
    assert fsdp["frozen_bytes"] == frozen // 4 and fsdp["ddp_bucket_bytes"] == 0 and fsdp["total_bytes"] < est["total_bytes"]
    assert "GiB" in describe(est, 80 * GIB) and "of 80.0 GiB" in describe(est, 80 * GIB)
    with pytest.raises(ValueError, match="strategy"):
        memory_estimate(peft, batch=1, seq_len=1, strategy="zero3")


_QWEN = {}


def _qwen():
    if not _QWEN:
        import tempfile
        from retinabench.models.tiny import build_tiny_qwen2_vl
        folder = tempfile.mkdtemp(prefix="rb-qwen-")
        _QWEN["v"] = (build_tiny_qwen2_vl(folder), folder)
    return _QWEN["v"]


# --- examples and the label mask ---------------------------------------------------------------------------------
def test_examples_are_the_training_split_rendered_by_the_prompt_registry(world, prompts, trained):
    split = world["splits"][SOURCE["name"]]
    ex = trained["examples"]
    train = split[split["split"] == "train"]
    assert [e.image_id for e in ex] == list(train["image_id"])
    assert not set(e.image_id for e in ex) & set(split.loc[split["split"] != "train", "image_id"])
    q = prompts.mllm("focus", SOURCE).question
    assert all(e.question == q for e in ex)
    assert [e.answer for e in ex] == ["yes" if y == 1 else "no" for y in train["y"]]
    leaky = split.copy()
    leaky.loc[leaky.index[leaky["split"] == "test"][0], "patient_id"] = train["patient_id"].iloc[0]
    with pytest.raises(ValueError, match="not patient-disjoint"):
        L.training_examples(world["images"], world["ids"], world["manifest"], leaky, SOURCE, prompts)


def test_only_the_assistant_answer_is_supervised(base, trained):
    for mllm in (_load(base), load_mllm(*_qwen())):
        tok = mllm.tokenizer
        ex = trained["examples"][:2]
        batch = L.SFTCollator(mllm.processor, trained["prompt"])(ex)
        for i, e in enumerate(ex):
            kept = batch["labels"][i][batch["labels"][i] != L.IGNORE_INDEX]
            assert tok.decode(kept).strip() == e.answer  # the answer token(s) only: no prompt, image or pad
            # and they are the conversation's last real tokens
            n = int(batch["attention_mask"][i].sum())
            assert torch.equal(batch["input_ids"][i, n - len(kept):n], kept)
        assert (batch["labels"][batch["attention_mask"] == 0] == L.IGNORE_INDEX).all()
        full = L.SFTCollator(mllm.processor, trained["prompt"], "full")(ex)  # FOCUS's variant, by name
        image = torch.isin(full["input_ids"], torch.tensor(L.image_token_ids(mllm.processor)))
        assert image.sum() > 0 and (full["labels"][image] == L.IGNORE_INDEX).all()  # image tokens out, as FOCUS
        real = (full["attention_mask"] == 1) & ~image
        assert torch.equal(full["labels"][real], full["input_ids"][real])  # every text token of prompt and answer
        assert (full["labels"][full["attention_mask"] == 0] == L.IGNORE_INDEX).all()


# --- training and outputs ----------------------------------------------------------------------------------------
def test_training_lowers_the_loss_and_writes_adapter_log_compute_and_sidecar(trained, base):
    rec, out = trained["record"], trained["out"]
    log = pd.read_parquet(out / "train_log.parquet")
    assert list(log["step"]) == list(range(1, 7))
    assert log["train_loss"].iloc[-1] < log["train_loss"].iloc[0] - 0.2
    compute = json.loads((out / "compute.json").read_text())
    assert compute["steps"] == 6 and compute["peak_mem_mb"] > 0 and compute["train_seconds"] > 0
    est = compute["memory_estimate"]  # logged before training; the base weights are fp32 on CPU
    assert est["lora_params"] == compute["trainable_params"] and est["frozen_bytes"] == 4 * (
        compute["total_params"] - compute["trainable_params"])
    mods = dict(_load(base).model.named_modules())
    assert compute["trainable_params"] == sum(16 * (mods[n].in_features + mods[n].out_features)
                                              for n in L.language_model_linears(_load(base).model))
    assert not (out / "checkpoints").exists()  # removed once the adapter is written (keep_checkpoints: false)
    side = read_sidecar(rec["adapter"])
    assert set(side["files"]) == {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    info = side["extra"]["adapter"]
    assert info["base"]["name"] == "tiny_llava" and "model.safetensors" in info["base"]["files"]
    assert info["task"] == SOURCE["name"] and info["dataset"] == "phantom" and info["prompt_set"] == "focus"
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"], cfg["bias"]) == (16, 16, 0.05, "none")
    assert cfg["base_model_name_or_path"] == "tiny_llava"  # not the loader's temporary folder


def test_the_same_training_gives_the_same_adapter_bytes(world, prompts, base, trained, tmp_path):
    settings = trained["settings"]
    rec = L.train_lora(_load(base), trained["examples"], trained["prompt"], tmp_path, settings, entry=base[0],
                       task=SOURCE, log=lambda m: None)
    A.write_adapter_sidecar(rec["adapter"], rec)
    assert read_sidecar(rec["adapter"])["files"] == read_sidecar(trained["record"]["adapter"])["files"]


def test_reloaded_adapter_changes_the_answers_through_the_same_path(predictions, trained):
    base_p, adapter_p = predictions
    key = ["image_id", "dataset", "task", "protocol", "regime", "split"]
    # the adapter's rows carry their own protocol names, the base scoring's under the mapping
    assert set(adapter_p["protocol"]) == {"mllm_lora", "mllm_lora_renorm"}
    assert {M.base_protocol(p) for p in adapter_p["protocol"]} == set(base_p["protocol"])
    assert M.adapter_protocol("mllm_renorm@plain") == "mllm_lora_renorm@plain"
    m = base_p.merge(adapter_p.assign(protocol=adapter_p["protocol"].map(M.base_protocol)), on=key,
                     suffixes=("_b", "_a"))
    assert len(m) == len(base_p) == len(adapter_p)
    assert (m["prompt_b"] == m["prompt_a"]).all() and (m["prompt_set_b"] == m["prompt_set_a"]).all()
    assert np.abs(m["prob_yes_a"] - m["prob_yes_b"]).max() > 1e-3
    assert (adapter_p["train_dataset"] == "phantom").all() and adapter_p["adapter"].str.len().eq(64).all()


# --- strict loading ----------------------------------------------------------------------------------------------
@pytest.fixture()
def adapter_copy(trained, tmp_path):
    d = tmp_path / "adapter"
    shutil.copytree(trained["record"]["adapter"], d)
    shutil.copy(str(trained["record"]["adapter"]) + ".prov.json", str(d) + ".prov.json")
    return d


def test_missing_or_altered_files_fail_to_load(base, adapter_copy):
    (adapter_copy / "adapter_model.safetensors").unlink()
    with pytest.raises(A.AdapterError, match="missing file adapter_model.safetensors"):
        A.load_adapter(_load(base), adapter_copy)
    with pytest.raises(A.AdapterError, match="does not exist"):
        A.load_adapter(_load(base), adapter_copy.parent / "nowhere")


def test_altered_weights_and_missing_sidecar_fail(base, adapter_copy):
    cfg = adapter_copy / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace('"r": 16', '"r": 8'))
    with pytest.raises(A.AdapterError, match="adapter_config.json has sha256"):
        A.load_adapter(_load(base), adapter_copy)
    (adapter_copy.parent / "adapter.prov.json").unlink()
    with pytest.raises(A.AdapterError, match="no provenance sidecar"):
        A.load_adapter(_load(base), adapter_copy)


def test_wrong_base_model_fails(trained, tmp_path):
    from retinabench.models.tiny import build_tiny_llava
    other = build_tiny_llava(tmp_path / "other", seed=1)  # same architecture, other weights
    with pytest.raises(A.AdapterError, match="weight files differ"):
        A.load_adapter(load_mllm(other, tmp_path / "other"), trained["record"]["adapter"])
    with pytest.raises(A.AdapterError, match="trained on base model 'tiny_llava', not 'tiny_qwen2_vl'"):
        A.load_adapter(load_mllm(*_qwen()), trained["record"]["adapter"])


def test_mismatched_modules_fail_before_the_model_is_touched(base, adapter_copy):
    from safetensors.torch import load_file, save_file

    from retinabench.provenance import write_sidecar
    rec = read_sidecar(adapter_copy)
    w = load_file(str(adapter_copy / "adapter_model.safetensors"))
    key = next(k for k in w if "q_proj.lora_A" in k)
    renamed = {(k.replace("layers.0.self_attn.q_proj", "layers.0.self_attn.nope") if k.startswith(key[:-14]) else k):
               v for k, v in w.items()}
    save_file(renamed, str(adapter_copy / "adapter_model.safetensors"))
    write_sidecar(adapter_copy, rule="test", extra=rec["extra"])  # re-recorded: only the module check can catch it
    m = _load(base)
    with pytest.raises(A.AdapterError, match="do not exist"):
        A.load_adapter(m, adapter_copy)
    assert not any("lora" in n for n, _ in m.model.named_modules())  # base untouched: no silent half-load
    shapes = dict(w)
    shapes[key] = torch.zeros(8, shapes[key].shape[1])
    save_file(shapes, str(adapter_copy / "adapter_model.safetensors"))
    write_sidecar(adapter_copy, rule="test", extra=rec["extra"])
    with pytest.raises(A.AdapterError, match="LoRA shapes"):
        A.load_adapter(_load(base), adapter_copy)
    dropped = {k: v for k, v in w.items() if "layers.1.mlp.down_proj" not in k}
    save_file(dropped, str(adapter_copy / "adapter_model.safetensors"))
    write_sidecar(adapter_copy, rule="test", extra=rec["extra"])
    with pytest.raises(A.AdapterError, match="targets 14 modules of this model, its weights cover 13"):
        A.load_adapter(_load(base), adapter_copy)


# --- paired deltas on the phantom --------------------------------------------------------------------------------
def test_paired_delta_table_has_in_domain_and_out_of_domain_rows(predictions, world, tmp_path):
    from retinabench.reliability.adapter_deltas import adapter_deltas, table5, table5_figure
    base_p, adapter_p = predictions
    res = adapter_deltas(base_p, adapter_p, world["manifest"], TASKS, n_boot=1000)
    pairs = res["pairs"]
    assert sorted(pairs["domain"]) == ["in-domain", "in-domain", "out-of-domain", "out-of-domain"]  # 2 protocols
    comp = res["comparisons"]
    assert set(comp["variant"]) == {"invalid_wrong", "valid_both", "all_rows"}
    tab = table5(res["domains"], protocol="mllm_renorm")
    assert list(tab["domain"]) == ["in-domain", "out-of-domain", "in-domain", "out-of-domain"]
    assert list(tab["model"]) == ["tiny_llava", "tiny_llava", "all", "all"] and (tab["n"] == 1).all()
    files = table5_figure(res["domains"], tmp_path / "table5.png", protocol="mllm_renorm")
    assert all(p.endswith((".png", ".pdf")) for p in files)


# --- a real kill -------------------------------------------------------------------------------------------------
KILL_SCRIPT = """
import os, pickle, signal, sys, torch
from transformers import TrainerCallback
from retinabench.protocols import lora as L
from retinabench.models.mllm import load_mllm
torch.set_num_threads(1)
entry, folder, examples, prompt, settings, task, out = pickle.load(open(sys.argv[1], "rb"))

class Kill(TrainerCallback):
    def on_save(self, args, state, control, **kw):  # called once checkpoint-<step> is on disk
        if state.global_step == 4:
            os.kill(os.getpid(), signal.SIGKILL)

L.train_lora(load_mllm(entry, folder), examples, prompt, out, settings, entry=entry, task=task, callbacks=[Kill()],
             log=lambda m: None)
"""


@pytest.mark.slow
def test_sigkilled_training_resumes_to_the_same_adapter(base, trained, tmp_path):
    import os
    import pickle
    import signal
    import subprocess
    import sys

    from safetensors.torch import load_file
    out = tmp_path / "run"
    args = (base[0], str(base[1]), trained["examples"], trained["prompt"], trained["settings"], SOURCE, str(out))
    (tmp_path / "args.pkl").write_bytes(pickle.dumps(args))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "args.pkl")], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert (out / "checkpoints" / "checkpoint-4").is_dir() and not (out / "adapter").exists()
    logs = []
    rec = L.train_lora(_load(base), trained["examples"], trained["prompt"], out, trained["settings"], entry=base[0],
                       task=SOURCE, log=logs.append)
    assert rec["compute"]["resumed_from"].endswith("checkpoint-4") and any("resuming" in m for m in logs)
    want = load_file(str(trained["out"] / "adapter" / "adapter_model.safetensors"))
    got = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert set(got) == set(want)
    # CPU, one thread, same data order, dropout RNG restored by the Trainer: the same adapter to float tolerance
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst < 1e-6, worst
    log = pd.read_parquet(out / "train_log.parquet")
    ref = pd.read_parquet(trained["out"] / "train_log.parquet")
    assert list(log["step"]) == list(ref["step"])
    np.testing.assert_allclose(log["train_loss"], ref["train_loss"], rtol=1e-5)


def test_a_stale_checkpoint_of_other_settings_is_not_resumed(base, trained, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoints" / "run.json").write_text("{}")
    logs = []
    rec = L.train_lora(_load(base), trained["examples"][:8], trained["prompt"], out,
                       L.LoraSettings(**{**FAST, "max_steps": 1}), entry=base[0], task=SOURCE, log=logs.append)
    assert rec["compute"]["resumed_from"] is None and any("starting over" in m for m in logs)


def test_focus_variant_adapter_reloads_strictly_with_its_full_modules(world, prompts, base, tmp_path):
    """FOCUS's variant (all linears incl. the vision tower, lm_head / embed_tokens trained in full) saves whole
    modules beside the LoRA factors: the strict loader accepts exactly the config's modules_to_save, with the
    model's shapes, and the reloaded adapter carries the trained full-module weights; a stray full tensor fails."""
    from safetensors.torch import load_file, save_file

    from retinabench.provenance import write_sidecar
    torch.set_num_threads(1)
    settings = L.LoraSettings(**{**FAST, "max_steps": 2}, targets="all_linear", modules_to_save="focus")
    entry = dict(base[0], hub_id="llava-hf/llava-1.5-7b-hf")  # a LLaVA (not a pure Llama): FOCUS saves both modules
    examples, prompt = L.training_examples(world["images"], world["ids"], world["manifest"],
                                           world["splits"][SOURCE["name"]], SOURCE, prompts, settings)
    rec = L.train_lora(_load(base), examples, prompt, tmp_path / "run", settings, entry=entry, task=SOURCE)
    A.write_adapter_sidecar(rec["adapter"], rec)
    adapter = Path(rec["adapter"])
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    full = sorted(k for k in saved if ".lora_" not in k)
    assert any(k.endswith("lm_head.weight") for k in full) and any("embed_tokens" in k for k in full)
    assert any("vision_tower" in k for k in saved if ".lora_" in k)
    m = A.load_adapter(_load(base), adapter)
    head = next(p for n, p in m.model.named_parameters() if "lm_head" in n and "modules_to_save" in n)
    key = next(k for k in full if k.endswith("lm_head.weight"))
    assert torch.equal(head.detach().to(saved[key].dtype), saved[key])
    saved["base_model.model.model.language_model.norm.weight"] = torch.ones(8)
    save_file(saved, str(adapter / "adapter_model.safetensors"))
    write_sidecar(adapter, rule="test", extra=read_sidecar(adapter)["extra"])
    with pytest.raises(A.AdapterError, match="neither a LoRA A/B weight nor a weight of the config's modules_to_save"):
        A.load_adapter(_load(base), adapter)
