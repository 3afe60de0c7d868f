"""GPU check of LoRA SFT of an MLLM at real size (run on a CUDA machine; ``--smoke --device cpu`` runs the same code
on a tiny config so that this script cannot rot between GPU runs).

Nothing can be downloaded on the GPU machine, so the model is a registry architecture with random weights (default:
Qwen3-VL-8B, 8.8 B parameters, built on the device in bf16 by bench/gpu_check_interfaces.py's builder, saved in the
hub layout, loaded back through ``load_mllm``). On random 224-px images with the FOCUS question of the task:

1. training (``train_lora``: every language-model linear, r 16, bf16 + gradient checkpointing on CUDA, FOCUS's
   per-device 4 x 4) for ``--steps`` optimizer steps: s/step, examples/s, peak GPU memory, trainable parameters,
   loss finite and falling;
2. the adapter reloaded strictly (``load_adapter``: sidecar sha256s, base record, module shapes) onto a fresh base
   model, then one batch answered: reload time, generate time, and whether the answers' first-step scores moved.

Prints a summary and writes ``$OUT/gpu_check_lora.json`` (or ``--json PATH``).
"""
from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from common import gpu_check_device, gpu_check_parser, write_gpu_check  # noqa: E402
from gpu_check_interfaces import TASK, _peak_gb, _reset_peak, _sync, build_qwen3_vl  # noqa: E402
from retinabench.prompts import load_prompts  # noqa: E402
from retinabench.models import load_adapter, load_mllm, write_adapter_sidecar  # noqa: E402
from retinabench.protocols.lora import LoraSettings, SFTExample, train_lora  # noqa: E402
from retinabench.protocols.mllm import generate_answers  # noqa: E402
from retinabench.registry import load_registry  # noqa: E402


def check_lora(entry: dict, dev, smoke: bool, steps: int, n_answer: int, tmp: Path) -> dict:
    folder = tmp / "base"
    local = build_qwen3_vl(entry, folder, dev, smoke)
    prompt = load_prompts(REPO / "config/prompts.yaml").mllm("focus", TASK)
    settings = LoraSettings(max_steps=steps, save_steps=max(1, steps // 2), lr=1e-4,
                            **({"batch_size": 2, "grad_accum": 1} if smoke else {}))
    batch, accum = settings.batching({"params_m": local["params"] / 1e6})
    side = 64 if smoke else 224
    n_examples = batch * accum * steps
    rng = np.random.default_rng(0)
    examples = [SFTExample(f"img{i}", rng.integers(0, 256, (side, side, 3), dtype=np.uint8), prompt.question,
                           "yes" if i % 3 == 0 else "no") for i in range(n_examples)]
    t0 = time.perf_counter()
    mllm = load_mllm(local, weights=folder, device=str(dev))
    load_s = time.perf_counter() - t0
    answer_images = [e.image for e in examples[:n_answer]]
    questions = [prompt.question] * n_answer
    # the base model's answers first (training wraps this model in the adapter)
    base_scores = generate_answers(mllm, prompt, questions, answer_images, max_new_tokens=8, batch_size=n_answer)
    _reset_peak(dev)
    rec = train_lora(mllm, examples, prompt, tmp / "run", settings, entry={**local, "params_m": local["params"] / 1e6},
                     task=TASK, log=lambda m: None)
    write_adapter_sidecar(rec["adapter"], rec)
    compute = rec["compute"]
    peak_train = _peak_gb(dev)
    import pandas as pd
    losses = pd.read_parquet(tmp / "run" / "train_log.parquet")["train_loss"].to_numpy()
    del mllm
    gc.collect()
    t0 = time.perf_counter()
    adapted = load_adapter(load_mllm(local, weights=folder, device=str(dev)), rec["adapter"])
    reload_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    answers = generate_answers(adapted, prompt, questions, answer_images, max_new_tokens=8, batch_size=n_answer)
    _sync(dev)
    generate_s = time.perf_counter() - t0
    moved = float(np.abs(np.asarray(answers["prob_yes"]) - np.asarray(base_scores["prob_yes"])).max())
    return {"model": local["name"], "params_b": local["params"] / 1e9, "device": str(dev), "steps": compute["steps"],
            "batch_size": compute["batch_size"], "grad_accum": compute["grad_accum"], "bf16": compute["bf16"],
            "gradient_checkpointing": compute["gradient_checkpointing"], "load_s": load_s,
            "train_s": compute["train_seconds"], "s_per_step": compute["train_seconds"] / max(1, compute["steps"]),
            "examples_per_s": n_examples / compute["train_seconds"], "peak_train_gpu_gb": peak_train,
            "trainable_params_m": compute["trainable_params"] / 1e6, "loss_first": float(losses[0]),
            "loss_last": float(losses[-1]), "loss_finite": bool(np.isfinite(losses).all()),
            "adapter_mb": sum(f.stat().st_size for f in Path(rec["adapter"]).iterdir()) / 2 ** 20,
            "reload_s": reload_s, "generate_s": generate_s, "answers": n_answer, "max_prob_yes_change": moved}


def main(argv=None) -> dict:
    ap = gpu_check_parser(__doc__, "tiny config (CPU): keeps the script working")
    ap.add_argument("--mllm", default="qwen3_vl_8b_instruct", help="registry entry (a Qwen3-VL architecture)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--answers", type=int, default=8)
    args = ap.parse_args(argv)
    dev = gpu_check_device(args)
    reg = load_registry(REPO / "config/encoders.yaml", "encoders")
    with tempfile.TemporaryDirectory() as tmp:
        r = check_lora(reg[args.mllm], dev, args.smoke, 2 if args.smoke else args.steps,
                       2 if args.smoke else args.answers, Path(tmp))
    peak = r["peak_train_gpu_gb"]
    print(f"lora {r['model']}: {r['params_b']:.2f} B params on {r['device']} (bf16 {r['bf16']}, checkpointing "
          f"{r['gradient_checkpointing']}), {r['batch_size']} x {r['grad_accum']}: {r['s_per_step']:.2f} s/step, "
          f"{r['examples_per_s']:.1f} examples/s, peak {peak if peak is None else round(peak, 1)} GB, "
          f"{r['trainable_params_m']:.1f} M trainable, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}; adapter "
          f"{r['adapter_mb']:.1f} MB reloaded in {r['reload_s']:.1f} s, {r['answers']} answers in "
          f"{r['generate_s']:.1f} s, max p_yes change {r['max_prob_yes_change']:.3g}")
    write_gpu_check(args, "gpu_check_lora", r)
    return r


if __name__ == "__main__":
    main()
