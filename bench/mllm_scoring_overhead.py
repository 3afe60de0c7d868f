"""MLLM yes/no scoring overhead: generate + first-step scoring (full-vocabulary softmax, yes/no variants) +
answer parsing, against generate alone (text only, no logits returned), side by side in one run.

Both arms run the same batches of the same model through retinabench.protocols.mllm.generate_answers (the code
the protocol runs), interleaved, best of ``REPEATS``. Two models: the tiny LLaVA of the tests, and a larger random
LLaVA that is still CPU-feasible (Llama 8 layers x 512, 32k vocabulary, CLIP 4 layers x 256 at 64 px: 64 image
tokens). Goal: ratio <= 1.05.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved_times, set_threads  # noqa: E402

from retinabench.prompts import load_prompts  # noqa: E402
from retinabench.models import load_mllm  # noqa: E402
from retinabench.models.mllm import chat_texts  # noqa: E402
from retinabench.protocols.mllm import generate_answers, parse_yes_no  # noqa: E402
from retinabench.models.tiny import build_tiny_llava  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REPEATS = 9
TASK = {"name": "t", "dataset": "d", "label": "dr5", "classes": ["no", "yes"], "harmonised": "any_dr"}
CONFIGS = {
    "tiny LLaVA": ({}, 16, 8),
    "larger LLaVA (Llama 6x384, vocab 32k, 64 px)": (
        {"text_hidden": 384, "text_layers": 6, "vision_hidden": 128, "vision_layers": 2, "image_size": 64,
         "vocab": 32000}, 8, 8),
}


def measure(name: str, kwargs: dict, n: int, batch: int, max_new_tokens: int = 8) -> dict:
    from retinabench.protocols.mllm import _batch_inputs, greedy_config, yes_no_scores
    prompts = load_prompts(REPO / "config/prompts.yaml")
    prompt = prompts.mllm("focus", TASK)
    with tempfile.TemporaryDirectory() as tmp:
        entry = build_tiny_llava(tmp, **kwargs)
        mllm = load_mllm(entry, weights=tmp, device="cpu")
    size = kwargs.get("image_size", 32)
    images = list(np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8))
    questions = [prompt.question] * n

    def alone():
        return generate_answers(mllm, prompt, questions, images, max_new_tokens=max_new_tokens, batch_size=batch,
                                score=False)

    def scored():
        out = generate_answers(mllm, prompt, questions, images, max_new_tokens=max_new_tokens, batch_size=batch)
        out["parsed"] = [parse_yes_no(a) for a in out["answer"]]
        return out

    alone(), scored()  # warm-up
    t_alone, t_scored = interleaved_times(alone, scored, REPEATS)
    # the added work in isolation: scoring the first-step logits of one batch + parsing its answers
    inputs = _batch_inputs(mllm, chat_texts(mllm.processor, prompt, questions[:batch]), images[:batch])
    with torch.inference_mode():
        out = mllm.model.generate(**inputs, generation_config=greedy_config(mllm.model, max_new_tokens, 0))
    answers = mllm.tokenizer.batch_decode(out.sequences[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    t0 = time.perf_counter()
    for _ in range(50):
        yes_no_scores(out.logits[0], mllm.tokens)
        [parse_yes_no(a) for a in answers]
    extra_per_batch = (time.perf_counter() - t0) / 50
    per_batch_alone = min(t_alone) / -(-n // batch)
    params = sum(p.numel() for p in mllm.model.parameters()) / 1e6
    return {"model": name, "params_m": round(params, 2), "vocab": mllm.model.config.text_config.vocab_size,
            "images": n, "batch": batch, "generate_alone_s": min(t_alone), "generate_score_parse_s": min(t_scored),
            "ratio_best": min(t_scored) / min(t_alone),
            "ratio_median_pairs": float(np.median(np.array(t_scored) / np.array(t_alone))),
            "scoring_parsing_share": extra_per_batch / per_batch_alone}


def main() -> list[dict]:
    set_threads(1)  # one thread: less noise from a shared machine; the ratio is what matters
    rows = [measure(name, kw, n, b) for name, (kw, n, b) in CONFIGS.items()]
    for r in rows:
        print(f"{r['model']:<46} {r['params_m']:>6.2f} M params, vocab {r['vocab']:>6}, {r['images']} images: "
              f"generate alone {r['generate_alone_s']:.3f} s, + scoring + parsing {r['generate_score_parse_s']:.3f} s"
              f" -> ratio {r['ratio_best']:.3f} (best of {REPEATS}), {r['ratio_median_pairs']:.3f} (median of "
              f"paired runs); scoring + parsing alone = {100 * r['scoring_parsing_share']:.2f} % of a batch's "
              f"generate  [goal <= 1.05]")
    return rows


if __name__ == "__main__":
    main()
