"""LoRA supervised fine-tuning (SFT) of multimodal LLMs for yes/no tasks (FOCUS).

Training (:func:`train_lora`): one adapter per (MLLM, source dataset, task), peft LoRA r 16, α 16, dropout 0.05, no
bias, 1 epoch, lr 2e-5, per-device batch 4 × gradient accumulation 4 (1 × 8 for the 27B size class, ``params_m >=
large_min_params_m``), bf16 and gradient checkpointing on CUDA, as FOCUS's run_sft.sh / train_sft.py. The modules
(:mod:`retinabench.protocols.lora_targets`): ours, every ``nn.Linear`` of the language model; FOCUS's, every
linear module vision tower included plus ``lm_head`` / ``embed_tokens`` trained in full (``lora.train.targets``,
``modules_to_save``). Whatever trains is kept in fp32. Over W processes the effective batch is batch ×
accumulation (ours, ``effective_batch: keep``) or batch × accumulation × W (FOCUS, ``per_process``). A per-process
memory estimate (:mod:`retinabench.protocols.lora_memory`) is logged before training and kept in compute.json.
transformers' ``Trainer`` runs the loop (accelerate underneath: ``torchrun`` / ``accelerate launch`` give one
process per GPU with no code change); checkpoints every ``save_steps`` optimizer steps, and a killed job resumes
from the last one (optimizer, scheduler, RNG and data position restored by the Trainer).

Examples (:func:`training_examples`) are the TRAINING split of the source dataset for the task (patient-disjoint
from its val/test rows, checked again here), rendered as chat messages through the same prompt registry, leakage
guard and chat template as inference: user (image + the task's question), assistant (``yes`` / ``no``). The loss
is on the assistant turn only (:class:`SFTCollator`: every prompt token, image tokens included, and every pad
is -100); FOCUS supervises every text token of the conversation (its collator masks pads and image tokens only) —
:data:`LABEL_MASKS` keeps that variant available by name (``label_mask: full``) for a reproduction.

Strict loading and the adapter's provenance sidecar live in :mod:`retinabench.models.adapters`; inference is
:func:`retinabench.protocols.mllm.run` with the adapter: the same prompts, scoring and parser.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from retinabench.atomic import write_text_atomic
from retinabench.prompts import PromptRegistry, YesNoPrompt, render_questions
from retinabench.models.adapters import base_record, name_base_model
from retinabench.models.mllm import MLLM
from retinabench.protocols.lora_targets import (all_linears, language_model_linears, language_model_prefix,
                                                lora_config, modules_to_save, target_linears)
from retinabench.settings.layers import LABEL_MASKS, LoraSettings

FOCUS = LoraSettings()  # FOCUS's training settings: the defaults of the config's lora.train

IGNORE_INDEX = -100
PROTOCOL = "mllm_lora"            # the training log's protocol name
# --- examples and the label mask ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SFTExample:
    image_id: str
    image: np.ndarray = field(repr=False)
    question: str
    answer: str


def training_examples(images: np.ndarray, image_ids: Sequence[str], manifest: pd.DataFrame, split: pd.DataFrame,
                      task: dict, prompts: PromptRegistry, settings: LoraSettings = FOCUS
                      ) -> tuple[list[SFTExample], YesNoPrompt]:
    """The task's training-split rows as (image, rendered question, ``yes``/``no``) in split order, and the
    prompt they were rendered with. Refuses a split whose training patients appear among its val/test rows."""
    if "split" not in split or "y" not in split:
        raise KeyError(f"lora {task['name']}: the split table needs columns split and y")
    part = split[split["split"] == "train"]
    if settings.train_balanced:
        part = part[part["balanced"].astype(bool)]
    if part.empty:
        raise ValueError(f"lora {task['name']}: the split has no training rows")
    held_out = split[split["split"] != "train"]
    shared = sorted(set(part["patient_id"].astype(str)) & set(held_out["patient_id"].astype(str)))
    if shared:
        raise ValueError(f"lora {task['name']}: {len(shared)} patients are in the training split and in val/test "
                         f"(e.g. {shared[:3]}): the split is not patient-disjoint")
    set_name = settings.prompt_set or prompts.default("mllm")
    prompt = prompts.mllm(set_name, task)  # the leakage guard's field check
    meta = manifest[manifest["dataset"] == task["dataset"]].drop_duplicates("image_id").set_index("image_id")
    ids = part["image_id"].astype(str).tolist()
    absent = [i for i in ids if i not in meta.index]
    if absent:
        raise KeyError(f"lora {task['name']}: {len(absent)} training images are not in the manifest, e.g. "
                       f"{absent[:3]}")
    index = {i: k for k, i in enumerate(image_ids)}
    lacking = [i for i in ids if i not in index]
    if lacking:
        raise KeyError(f"lora {task['name']}: {len(lacking)} training images are not among the images given, "
                       f"e.g. {lacking[:3]}")
    questions = render_questions(prompt, meta.loc[ids].reset_index())  # the leakage guard on every row
    yes = prompt.yes_index
    answers = ["yes" if int(y) == yes else "no" for y in part["y"]]
    return [SFTExample(i, images[index[i]], q, a) for i, q, a in zip(ids, questions, answers)], prompt


def conversation(prompt: YesNoPrompt, question: str, answer: str | None) -> list[dict]:
    """The chat messages of one example: inference's messages (system?, user: image + question), then the
    assistant's answer."""
    msgs = prompt.messages(question)
    if answer is not None:
        msgs = msgs + [{"role": "assistant", "content": [{"type": "text", "text": answer}]}]
    return msgs


# the image tokens FOCUS's collator masks (train_sft.py, collate_fn): Qwen's vision tokens, LLaVA's <image>, Gemma's
# begin-of-image token, and the processor's image token
FOCUS_IMAGE_TOKENS = ("<|image_pad|>", "<|vision_pad|>", "<|vision_start|>", "<|vision_end|>", "<image>")


def image_token_ids(processor) -> list[int]:
    """Token ids of the image placeholders and markers (what ``label_mask: full`` leaves out of the loss)."""
    tok = getattr(processor, "tokenizer", processor)
    vocab = tok.get_vocab()
    names = list(FOCUS_IMAGE_TOKENS)
    boi = getattr(tok, "boi_token", None) or tok.special_tokens_map.get("boi_token")
    if isinstance(boi, str):
        names.append(boi)
    ids = {vocab[n] for n in names if n in vocab}
    own = getattr(processor, "image_token_id", None)
    if isinstance(own, int):
        ids.add(own)
    return sorted(ids)


class SFTCollator:
    """Batches of :class:`SFTExample`: the processor's own batching (pixel values, image tokens) of the full
    conversations, right-padded; labels = input ids with every pad set to -100 and, under ``label_mask='answer'``
    (ours), every prompt token; under ``'full'`` (FOCUS) the image tokens (:func:`image_token_ids`) and any token
    equal to the pad id, so the loss covers every text token of prompt and answer. The prompt is the conversation
    rendered with ``add_generation_prompt`` (what inference feeds the model); its tokens must be a prefix of the
    full conversation's, or the collator refuses."""

    def __init__(self, processor, prompt: YesNoPrompt, label_mask: str = "answer"):
        if label_mask not in LABEL_MASKS:
            raise ValueError(f"label_mask must be one of {LABEL_MASKS}, got {label_mask!r}")
        self.processor, self.prompt, self.label_mask = processor, prompt, label_mask
        self.masked_ids = image_token_ids(processor) if label_mask == "full" else []

    def texts(self, ex: SFTExample) -> tuple[str, str]:
        proc = self.processor
        head = proc.apply_chat_template(conversation(self.prompt, ex.question, None), add_generation_prompt=True,
                                        tokenize=False)
        full = proc.apply_chat_template(conversation(self.prompt, ex.question, ex.answer), tokenize=False)
        if not full.startswith(head):
            raise ValueError(f"image {ex.image_id}: the chat template's generation prompt is not a prefix of the "
                             f"conversation with its answer ({head[-40:]!r} vs {full[len(head) - 40:][:80]!r})")
        return head, full

    def __call__(self, examples: Sequence[SFTExample]) -> dict:
        heads, fulls = zip(*(self.texts(ex) for ex in examples))
        images = [[np.asarray(ex.image)] for ex in examples]
        batch = self.processor(text=list(fulls), images=images, padding=True, padding_side="right",
                               return_tensors="pt")
        head_ids = self.processor(text=list(heads), images=images, padding=True, padding_side="right",
                                  return_tensors="pt")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        labels = ids.clone()
        labels[mask == 0] = IGNORE_INDEX
        for i, ex in enumerate(examples):
            n_head = int(head_ids["attention_mask"][i].sum())
            n_full = int(mask[i].sum())
            if n_full <= n_head or not bool((ids[i, :n_head] == head_ids["input_ids"][i, :n_head]).all()):
                raise ValueError(f"image {ex.image_id}: the prompt's tokens are not a prefix of the conversation's "
                                 f"({n_head} prompt tokens, {n_full} in all): cannot mask the prompt")
            if self.label_mask == "answer":
                labels[i, :n_head] = IGNORE_INDEX
        if self.label_mask == "full":
            import torch
            pad = getattr(getattr(self.processor, "tokenizer", self.processor), "pad_token_id", None)
            drop = self.masked_ids + ([int(pad)] if pad is not None else [])
            labels[torch.isin(ids, torch.tensor(drop, dtype=ids.dtype))] = IGNORE_INDEX
        batch["labels"] = labels
        return dict(batch)


# --- training -----------------------------------------------------------------------------------------------
def _examples_fingerprint(examples: Sequence[SFTExample]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(f"{ex.image_id}\t{ex.answer}\t{ex.question}\n".encode())
        h.update(hashlib.sha256(np.ascontiguousarray(ex.image).tobytes()).digest())
    return h.hexdigest()


class _ExampleDataset:
    def __init__(self, examples):
        self.examples = list(examples)

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def _resolve_precision(settings: LoraSettings, device) -> tuple[bool, bool]:
    cuda = getattr(device, "type", str(device)) == "cuda"
    bf16 = settings.precision == "bf16" or (settings.precision == "auto" and cuda)
    gc = settings.gradient_checkpointing
    gc = cuda if gc == "auto" else bool(gc)
    return bf16, gc


def _memory(peft_model, collator: SFTCollator, first: Sequence[SFTExample], batch: int, world: int, device) -> dict:
    """The per-process memory estimate (:mod:`retinabench.protocols.lora_memory`) from the first batch's longest
    sequence and image tokens, and its log line."""
    import torch

    from retinabench.protocols.lora_memory import describe, memory_estimate
    sample = collator(list(first))
    seq_len = int(sample["attention_mask"].sum(dim=1).max())
    ids = set(image_token_ids(collator.processor))
    n_image = int(torch.isin(sample["input_ids"][0], torch.tensor(sorted(ids) or [-1])).sum())
    vision = getattr(peft_model.config, "vision_config", None)
    merge = int(getattr(vision, "spatial_merge_size", 1) or 1) ** 2
    est = memory_estimate(peft_model, batch=batch, seq_len=seq_len, world_size=world, strategy="ddp",
                          vision_tokens=n_image * merge)
    cuda = getattr(device, "type", str(device)) == "cuda"
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    line = describe(est, total)
    if total and est["total_bytes"] > total:
        sharded = memory_estimate(peft_model, batch=batch, seq_len=seq_len, world_size=world, strategy="fsdp",
                                  vision_tokens=n_image * merge)
        line += (f"; WARNING: more than the device holds (DDP keeps a full replica per process); FSDP full sharding "
                 f"would need {sharded['total_bytes'] / 2 ** 30:.1f} GiB per process")
    return {"estimate": est, "line": line}


def train_lora(mllm: MLLM, examples: Sequence[SFTExample], prompt: YesNoPrompt, out_dir: str | os.PathLike,
               settings: LoraSettings = FOCUS, *, entry: dict | None = None, task: dict | None = None,
               callbacks: Sequence = (), log=print) -> dict:
    """Train a LoRA adapter on ``examples``; write ``out_dir/adapter/`` (peft folder), ``train_log.parquet``
    (loss per optimizer step, the training-log schema) and ``compute.json``; return the run record.

    ``out_dir/checkpoints/`` holds the Trainer's checkpoints while it runs; a rerun after a kill resumes from
    the last one when ``run.json`` there matches this run (same settings, examples and base), else starts over.
    The adapter's provenance (files + sha256, base record, settings) goes to the sidecar the caller writes with
    :func:`retinabench.models.adapters.write_adapter_sidecar`; :func:`train_lora` returns everything it needs.
    """
    import torch
    from peft import get_peft_model
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    from retinabench.protocols.finetune import peak_memory_mb
    out = Path(out_dir)
    ckpt = out / "checkpoints"
    entry = entry or {"name": mllm.name}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batch, accum = settings.per_process(entry, world)
    bf16, grad_ckpt = _resolve_precision(settings, mllm.device)
    run: dict[str, Any] = {"settings": settings.record(), "examples_sha256": _examples_fingerprint(examples),
           "n_examples": len(examples), "base": base_record(mllm, entry), "prompt_set": prompt.set_name,
           "batch_size": batch, "grad_accum": accum, "world_size": world, "effective_batch": batch * accum * world,
           "bf16": bf16, "gradient_checkpointing": grad_ckpt}
    args = TrainingArguments(
        output_dir=str(ckpt), per_device_train_batch_size=batch, gradient_accumulation_steps=accum,
        num_train_epochs=float(settings.epochs), max_steps=int(settings.max_steps), learning_rate=float(settings.lr),
        lr_scheduler_type=settings.scheduler, warmup_steps=int(settings.warmup_steps),
        weight_decay=float(settings.weight_decay), logging_steps=1, logging_first_step=True, save_strategy="steps",
        save_steps=int(settings.save_steps), save_total_limit=int(settings.save_total_limit), bf16=bf16,
        activation_checkpointing=grad_ckpt,
        activation_checkpointing_kwargs={"use_reentrant": False} if grad_ckpt else None,
        seed=int(settings.seed), data_seed=int(settings.seed), report_to="none", remove_unused_columns=False,
        dataloader_num_workers=0, disable_tqdm=True, use_cpu=mllm.device.type != "cuda",
        ddp_find_unused_parameters=False)
    _ = args.device  # sets up the process group under torchrun
    # the checkpoint folder is rank 0's: every rank decides from what is there (read-only), then rank 0 clears a
    # stale one and records this run, the others wait (one process group from here: TrainingArguments set it up)
    from accelerate import PartialState
    state = PartialState()
    resume, stale = None, False
    if ckpt.is_dir():
        previous = json.loads((ckpt / "run.json").read_text()) if (ckpt / "run.json").is_file() else None
        last = get_last_checkpoint(str(ckpt))
        if previous == json.loads(json.dumps(run, default=str)) and last:
            resume = last
            log(f"lora {mllm.name}: resuming from {last}")
        else:
            stale = True
            log(f"lora {mllm.name}: {ckpt} holds another run's (or no) checkpoint: starting over")
    state.wait_for_everyone()
    if state.is_main_process:
        if stale:
            shutil.rmtree(ckpt)
        ckpt.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ckpt / "run.json", json.dumps(run, indent=1, default=str))
    state.wait_for_everyone()

    model = mllm.model
    if bf16:
        model.to(torch.bfloat16)
    model.config.use_cache = False
    torch.manual_seed(settings.seed)  # LoRA's A matrices are initialised from the global RNG
    peft_model = get_peft_model(model, lora_config(settings, model, entry))
    for p in peft_model.parameters():  # what trains is fp32 (LoRA already is; FOCUS upcasts every weight)
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    n_trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in peft_model.parameters())
    collator = SFTCollator(mllm.processor, prompt, settings.label_mask)
    memory = _memory(peft_model, collator, examples[:batch], batch, world, mllm.device)
    if state.is_main_process:
        log(f"lora {mllm.name}: " + memory["line"])
    trainer = Trainer(model=peft_model, args=args, train_dataset=_ExampleDataset(examples), data_collator=collator,
                      callbacks=list(callbacks) or None)
    dev = mllm.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - t0
    peak, peak_kind = peak_memory_mb(dev)
    if not trainer.is_world_process_zero():
        return {"rank": trainer.args.process_index}
    adapter = out / "adapter"
    if adapter.exists():
        shutil.rmtree(adapter)
    name_base_model(peft_model, run["base"].get("hub_id") or mllm.name)
    peft_model.save_pretrained(str(adapter))
    hist = [h for h in trainer.state.log_history if "loss" in h]
    log_df = pd.DataFrame({
        "encoder": mllm.name, "task": (task or {}).get("name", prompt.task_name), "protocol": PROTOCOL,
        "seed": int(settings.seed), "train_regime": "b" if settings.train_balanced else "u",
        "epoch": [int(np.floor(h.get("epoch", 0.0))) for h in hist], "step": [int(h["step"]) for h in hist],
        "lr": [float(h.get("learning_rate", np.nan)) for h in hist], "train_loss": [float(h["loss"]) for h in hist],
        "val_loss": np.nan, "best": False})
    from retinabench.schemas import write_table
    write_table(log_df, out / "train_log.parquet", "training_log")
    compute = {"train_seconds": seconds, "resumed_from": resume, "steps": int(trainer.state.global_step),
               "train_runtime_trainer": float(result.metrics.get("train_runtime", np.nan)),
               "peak_mem_mb": peak, "peak_mem_kind": peak_kind, "device": str(dev),
               "world_size": int(trainer.args.world_size), "n_examples": len(examples),
               "trainable_params": int(n_trainable), "total_params": int(n_total),
               "batch_size": batch, "grad_accum": accum, "effective_batch": batch * accum * world,
               "bf16": bf16, "gradient_checkpointing": grad_ckpt, "memory_estimate": memory["estimate"],
               "final_loss": float(hist[-1]["loss"]) if hist else float("nan")}
    write_text_atomic(out / "compute.json", json.dumps(compute, indent=1))
    if not settings.keep_checkpoints:
        shutil.rmtree(ckpt, ignore_errors=True)
    mllm.model = peft_model
    return {**run, "adapter": str(adapter), "train_log": str(out / "train_log.parquet"),
            "compute": compute, "target_modules": sorted(peft_model.peft_config["default"].target_modules),
            "task": (task or {}).get("name", prompt.task_name), "dataset": (task or {}).get("dataset")}


__all__ = ["LABEL_MASKS", "PROTOCOL", "LoraSettings", "SFTCollator", "SFTExample", "all_linears", "conversation",
           "image_token_ids", "language_model_linears", "language_model_prefix", "lora_config", "modules_to_save",
           "target_linears", "train_lora", "training_examples"]
