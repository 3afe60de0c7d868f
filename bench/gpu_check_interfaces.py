"""GPU check of the zero-shot and MLLM interfaces at real size (run on a CUDA machine; ``--smoke --device cpu``
runs the same code on tiny configs so that this script cannot rot between GPU runs).

Nothing can be downloaded on the GPU machine, so the real-size models are FOCUS's registry architectures with
random weights: the registry entry's ``hf_config`` (default: Qwen3-VL-8B, 8.8 B parameters; SigLIP SO400M/14@384
for zero-shot) built directly on the device in bf16, saved in the hub layout with a WordLevel tokenizer padded to
the model's vocabulary size, then loaded back through the loaders users run (``load_mllm``,
``load_dual_encoder``) and driven through the protocol code (``generate_answers``, ``embed_images``).

1. MLLM: one generate() per batch (bf16, left padding, greedy, 8 new tokens) on 224-px cache images; images/s,
   peak GPU memory, and the scoring overhead side by side (generate alone vs generate + first-step scoring +
   parsing, interleaved; goal ratio <= 1.05); the greedy first token equals the argmax of the scored logits.
2. Zero-shot: image embeddings of the cache (224 -> 384 px, bf16 autocast), class embeddings, both scorings;
   images/s and peak memory; probabilities finite and normalised.

Prints a table and writes ``$OUT/gpu_check_interfaces.json`` (or ``--json PATH``).
"""
from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from common import gpu_check_device, gpu_check_parser, write_gpu_check, interleaved_times  # noqa: E402
from retinabench.models import hf_config, load_dual_encoder, load_mllm  # noqa: E402
from retinabench.models.mllm import chat_texts  # noqa: E402
from retinabench.prompts import load_prompts  # noqa: E402
from retinabench.protocols.mllm import (_batch_inputs, generate_answers, greedy_config, parse_yes_no,  # noqa: E402
                                        yes_no_scores)
from retinabench.protocols.zeroshot import class_embeddings, embed_images, focus_proba, native_proba  # noqa: E402
from retinabench.registry import load_registry  # noqa: E402
from retinabench.models.tiny import SPECIAL, WORDS, filler_words, tiny_tokenizer  # noqa: E402

TASK = {"name": "t", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "harmonised": "any_dr"}
QWEN_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
SMOKE_QWEN3_VL = {
    "model_type": "qwen3_vl", "tie_word_embeddings": False,
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 2000, "tie_word_embeddings": False,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [8, 4, 4],
                                        "mrope_interleaved": True}},
    "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "deepstack_visual_indexes": [0]}}
SMOKE_SIGLIP = {"model_type": "siglip",
                "vision_config": {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "patch_size": 14, "image_size": 56},
                "text_config": {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "vocab_size": 500, "max_position_embeddings": 64}}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _peak_gb(dev) -> float | None:
    return torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else None


def _reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def _vocab_tokenizer(placeholder: str, vocab: int):
    """A WordLevel tokenizer with exactly ``vocab`` entries (filler words), so every id a random model can emit
    decodes."""
    return tiny_tokenizer(placeholder, words=WORDS + filler_words(vocab - len(SPECIAL) - len(WORDS)))


def _random_model(cls, config, dev, dtype):
    """Random weights built on the device itself (an 8 B model initialises in seconds there, not on the host)."""
    torch.manual_seed(0)
    with torch.device(dev):
        return cls._from_config(config, dtype=dtype).eval()


def build_qwen3_vl(entry: dict, folder: Path, dev, smoke: bool) -> dict:
    import transformers
    from transformers import AutoConfig, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    spec = json.loads(json.dumps(SMOKE_QWEN3_VL if smoke else entry["hf_config"]))
    vocab = spec["text_config"]["vocab_size"]
    tok = _vocab_tokenizer(QWEN_PLACEHOLDER, vocab)
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image_pad|>"),
                                                         ("video_token_id", "<|video_pad|>"),
                                                         ("vision_start_token_id", "<|vision_start|>"),
                                                         ("vision_end_token_id", "<|vision_end|>"))}
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, **ids) if smoke else hf_config(
        {**entry, "hf_config": {**entry["hf_config"], **ids}})
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = _random_model(getattr(transformers, entry["hf_full_class"]), config, dev, dtype)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 3
    improc = Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=64 * 64,
                                   max_pixels=224 * 224, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = Qwen3VLProcessor(image_processor=improc, tokenizer=tok, video_processor=Qwen3VLVideoProcessor(),
                            chat_template=tok.chat_template)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    _reset_peak(dev)
    return {"name": f"random_{entry['name']}", "interfaces": ["mllm"], "source": "transformers",
            "hf_config": {"model_type": "qwen3_vl"}, "hf_full_class": entry["hf_full_class"], "params": n_params}


def check_mllm(entry: dict, dev, smoke: bool, n: int, batch: int, repeats: int, tmp: Path) -> dict:
    folder = tmp / "mllm"
    t0 = time.perf_counter()
    local = build_qwen3_vl(entry, folder, dev, smoke)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mllm = load_mllm(local, weights=folder, device=str(dev))  # the loader users run (strict, hashed files)
    load_s = time.perf_counter() - t0
    prompt = load_prompts(REPO / "config/prompts.yaml").mllm("focus", TASK)
    side = 64 if smoke else 224
    images = list(np.random.default_rng(0).integers(0, 256, (n, side, side, 3), dtype=np.uint8))
    questions = [prompt.question] * n

    def alone():
        out = generate_answers(mllm, prompt, questions, images, max_new_tokens=8, batch_size=batch, score=False)
        _sync(dev)
        return out

    def scored():
        out = generate_answers(mllm, prompt, questions, images, max_new_tokens=8, batch_size=batch)
        out["parsed"] = [parse_yes_no(a) for a in out["answer"]]
        _sync(dev)
        return out

    _reset_peak(dev)
    scored(), alone()  # warm-up (kernels, allocator)
    t_alone, t_scored = interleaved_times(alone, scored, repeats)
    # greedy consistency: the first generated token is the argmax of the very logits that are scored
    inputs = _batch_inputs(mllm, chat_texts(mllm.processor, prompt, questions[:batch]), images[:batch])
    with torch.inference_mode():
        out = mllm.model.generate(**inputs, generation_config=greedy_config(mllm.model, 8, 0))
    first = out.sequences[:, inputs["input_ids"].shape[1]]
    consistent = bool(torch.equal(first, out.logits[0].argmax(-1)))
    s = yes_no_scores(out.logits[0], mllm.tokens)
    return {"model": local["name"], "params_b": local["params"] / 1e9, "dtype": str(mllm.dtype),
            "device": str(dev), "images": n, "batch": batch, "prompt_tokens": int(inputs["input_ids"].shape[1]),
            "build_save_s": build_s, "load_s": load_s, "generate_alone_s": min(t_alone),
            "generate_score_parse_s": min(t_scored), "ratio_best": min(t_scored) / min(t_alone),
            "ratio_median_pairs": float(np.median(np.array(t_scored) / np.array(t_alone))),
            "images_per_s": n / min(t_scored), "peak_gpu_gb": _peak_gb(dev), "greedy_first_token_is_argmax": consistent,
            "scores_finite": bool(np.isfinite(s["prob_yes"]).all() and np.isfinite(s["renorm"]).all()),
            "answer_tokens": sorted(mllm.tokens.counted, key=repr)}


def check_dual(entry: dict, dev, smoke: bool, n: int, batch: int, tmp: Path) -> dict:
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel
    folder = tmp / "dual"
    spec = json.loads(json.dumps(SMOKE_SIGLIP if smoke else entry["hf_config"]))
    spec.pop("model_type")
    tok = _vocab_tokenizer("<image>", spec["text_config"]["vocab_size"])
    tok.chat_template, tok.padding_side = None, "right"
    spec["text_config"].update(pad_token_id=0, bos_token_id=2, eos_token_id=3)
    size = spec["vision_config"]["image_size"]
    model = _random_model(SiglipModel, SiglipConfig(**spec), dev, torch.float32)  # fp32 weights, bf16 autocast
    model.save_pretrained(folder)
    SiglipImageProcessor(size={"height": size, "width": size}, image_mean=[0.5] * 3,
                         image_std=[0.5] * 3).save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    gc.collect()
    local = {"name": f"random_{entry['name']}", "interfaces": ["features", "zeroshot"], "source": "transformers",
             "hf_config": {"model_type": "siglip"}, "hf_full_class": "SiglipModel", "input_size": size,
             "normalization": "inception", "pooling": "pooler"}
    dual = load_dual_encoder(local, weights=folder)
    side = 64 if smoke else 224
    images = np.random.default_rng(1).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    _reset_peak(dev)
    embed_images(dual, images[:batch], batch_size=batch, device=str(dev))  # warm-up
    _sync(dev)
    t0 = time.perf_counter()
    emb = embed_images(dual, images, batch_size=batch, device=str(dev))
    _sync(dev)
    embed_s = time.perf_counter() - t0
    cls = class_embeddings(dual, load_prompts(REPO / "config/prompts.yaml").zeroshot("ensemble", TASK))
    pf, pn = focus_proba(emb, cls), native_proba(emb, cls, dual.logit_scale, dual.logit_bias)
    ok = bool(np.isfinite(pf).all() and np.isfinite(pn).all() and np.allclose(pf.sum(1), 1) and np.allclose(pn.sum(1), 1))
    return {"model": local["name"], "input_size": size, "images": n, "batch": batch, "embed_s": embed_s,
            "images_per_s": n / embed_s, "peak_gpu_gb": _peak_gb(dev), "probabilities_ok": ok,
            "logit_scale": dual.logit_scale, "logit_bias": dual.logit_bias}


def main(argv=None) -> dict:
    ap = gpu_check_parser(__doc__, "tiny configs (CPU): keeps the script working")
    ap.add_argument("--mllm", default="qwen3_vl_8b_instruct", help="registry entry (a Qwen3-VL architecture)")
    ap.add_argument("--dual", default="siglip_so400m_patch14_384", help="registry entry (a SigLIP architecture)")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    dev = gpu_check_device(args)
    reg = load_registry(REPO / "config/encoders.yaml", "encoders")
    n = 4 if args.smoke else args.images
    batch = 2 if args.smoke else args.batch
    with tempfile.TemporaryDirectory() as tmp:
        report = {"mllm": check_mllm(reg[args.mllm], dev, args.smoke, n, batch, 1 if args.smoke else args.repeats,
                                     Path(tmp)),
                  "zeroshot": check_dual(reg[args.dual], dev, args.smoke, 8 if args.smoke else 512,
                                         4 if args.smoke else 64, Path(tmp))}
    m, z = report["mllm"], report["zeroshot"]
    print(f"mllm  {m['model']}: {m['params_b']:.2f} B params {m['dtype']} on {m['device']}, {m['prompt_tokens']} "
          f"prompt tokens: load {m['load_s']:.1f} s, {m['images_per_s']:.1f} images/s at batch {m['batch']}, peak "
          f"{m['peak_gpu_gb'] if m['peak_gpu_gb'] is None else round(m['peak_gpu_gb'], 1)} GB; scoring + parsing "
          f"ratio {m['ratio_best']:.3f} (best) / {m['ratio_median_pairs']:.3f} (median) [goal <= 1.05]; greedy "
          f"first token = argmax: {m['greedy_first_token_is_argmax']}")
    print(f"zeroshot {z['model']} @{z['input_size']}px: {z['images_per_s']:.1f} images/s at batch {z['batch']}, "
          f"peak {z['peak_gpu_gb'] if z['peak_gpu_gb'] is None else round(z['peak_gpu_gb'], 1)} GB, probabilities "
          f"ok: {z['probabilities_ok']}")
    write_gpu_check(args, "gpu_check_interfaces", report)
    return report


if __name__ == "__main__":
    main()
