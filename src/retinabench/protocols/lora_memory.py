"""Per-process GPU memory estimate of a LoRA training job, logged before training starts
(:func:`retinabench.protocols.lora.train_lora`) and recorded in ``compute.json``.

Exact where the model says it: every parameter's bytes (``numel x element_size``), split into the frozen base and
what trains (LoRA matrices, full copies of ``modules_to_save``). Then the training state of what trains: its
gradients (same dtype) and AdamW's two moments (same dtype), and under DDP with more than one process the gradient
buckets DDP allocates (one more copy of the trainable gradients); under FSDP full sharding parameters, gradients and
optimizer states are divided by the world size. Activations are a rough upper bound under gradient checkpointing
(the layer inputs kept for every decoder layer, one layer's recompute after Korthikanti et al. 2022, ``34 h + 5 a s``
per token, and the fp32 logits with their gradient; the vision tower the same way when it trains), from the
model's config and the batch's longest sequence. Allocator fragmentation and the CUDA context (~0.5-1 GiB) are not
counted.
"""
from __future__ import annotations

GIB = 1024 ** 3
STRATEGIES = ("ddp", "fsdp")


def _cfg(config, *names: str, default: int = 0) -> int:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int):
            return v
    return default


def _activations(cfg, tokens: int, seq_len: int, act_bytes: int, logits: bool) -> int:
    h = _cfg(cfg, "hidden_size", "d_model", "embed_dim")
    layers = _cfg(cfg, "num_hidden_layers", "depth", "num_layers")
    heads = _cfg(cfg, "num_attention_heads", "num_heads", default=1)
    kept = tokens * h * layers * act_bytes
    recompute = tokens * (34 * h + 5 * heads * seq_len) * act_bytes
    out = 2 * tokens * _cfg(cfg, "vocab_size") * 4 if logits else 0
    return kept + recompute + out


def memory_estimate(model, *, batch: int, seq_len: int, world_size: int = 1, strategy: str = "ddp",
                    vision_tokens: int = 0, act_bytes: int = 2) -> dict:
    """Bytes per process of training ``model`` (a peft model: ``requires_grad`` marks what trains) on batches of
    ``batch`` sequences of ``seq_len`` tokens over ``world_size`` processes; ``vision_tokens`` = the vision tower's
    tokens per image (counted only when a vision parameter trains)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    frozen = trainable = lora = n_trainable = n_lora = 0
    vision_trains = False
    for name, p in model.named_parameters():
        b = p.numel() * p.element_size()
        if not p.requires_grad:
            frozen += b
            continue
        trainable += b
        n_trainable += p.numel()
        if "lora_" in name:
            lora += b
            n_lora += p.numel()
        vision_trains = vision_trains or any(k in name for k in ("vision_tower", "visual", "vision_model"))
    shard = world_size if strategy == "fsdp" else 1
    grads = trainable
    optimizer = 2 * trainable
    buckets = grads if strategy == "ddp" and world_size > 1 else 0
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    act = _activations(text, batch * seq_len, seq_len, act_bytes, logits=True)
    vision = getattr(config, "vision_config", None)
    if vision is not None and vision_trains and vision_tokens:
        act += _activations(vision, batch * vision_tokens, vision_tokens, act_bytes, logits=False)
    est: dict = {"strategy": strategy, "world_size": int(world_size), "batch": int(batch), "seq_len": int(seq_len),
           "frozen_bytes": frozen // shard, "trainable_bytes": trainable // shard, "lora_bytes": lora // shard,
           "trainable_params": int(n_trainable), "lora_params": int(n_lora),
           "saved_module_params": int(n_trainable - n_lora), "gradient_bytes": grads // shard,
           "optimizer_bytes": optimizer // shard, "ddp_bucket_bytes": buckets, "activation_bytes": int(act)}
    est["total_bytes"] = sum(int(est[k]) for k in ("frozen_bytes", "trainable_bytes", "gradient_bytes", "optimizer_bytes",
                                               "ddp_bucket_bytes", "activation_bytes"))
    return est


def describe(est: dict, device_bytes: int | None = None) -> str:
    """One log line of an estimate (GiB), with the fraction of the device's memory when known."""
    def g(k):
        return f"{est[k] / GIB:.2f}"
    line = (f"memory estimate per process ({est['strategy']}, {est['world_size']} process(es), batch {est['batch']} x "
            f"{est['seq_len']} tokens): frozen weights {g('frozen_bytes')} GiB + trainable {g('trainable_bytes')} GiB "
            f"({est['lora_params']:,} LoRA + {est['saved_module_params']:,} modules_to_save parameters) + gradients "
            f"{g('gradient_bytes')} + AdamW states {g('optimizer_bytes')} + DDP buckets {g('ddp_bucket_bytes')} + "
            f"activations <= {g('activation_bytes')} = {g('total_bytes')} GiB")
    if device_bytes:
        line += f" of {device_bytes / GIB:.1f} GiB on the device ({est['total_bytes'] / device_bytes:.0%})"
    return line


__all__ = ["GIB", "STRATEGIES", "describe", "memory_estimate"]
