"""The modules a LoRA adapter trains (``lora.train.targets``, ``lora.train.modules_to_save``) and its peft
``LoraConfig``: ours adapts every ``nn.Linear`` of the language model; FOCUS's (train_sft.py: ``LoraConfig(
target_modules="all-linear", modules_to_save=["lm_head", "embed_tokens"])``) every linear module but the output
embedding -- vision tower and projector included -- and trains ``lm_head`` and ``embed_tokens`` in full. Both
resolve to an explicit list of module names, recorded in adapter_config.json for the strict load-time check."""
from __future__ import annotations

from retinabench.models.adapters import AdapterError
from retinabench.settings.layers import LoraSettings


def language_model_prefix(model) -> str:
    """Qualified name of the language model inside an image-text-to-text model (``model.language_model``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for name, module in model.named_modules():
        if decoder is not None and module is decoder and name:
            return name
    for name, _ in model.named_modules():
        if name.split(".")[-1] == "language_model":
            return name
    raise AdapterError(f"{type(model).__name__}: cannot find its language model (no get_decoder(), no "
                       "'language_model' submodule)")


def language_model_linears(model) -> list[str]:
    """Every ``nn.Linear`` of the language model, by qualified name (``lm_head`` is outside it)."""
    import torch
    prefix = language_model_prefix(model) + "."
    names = [n for n, m in model.named_modules() if n.startswith(prefix) and isinstance(m, torch.nn.Linear)]
    if not names:
        raise AdapterError(f"{type(model).__name__}: the language model {prefix[:-1]!r} has no linear modules")
    return names


def all_linears(model) -> list[str]:
    """Every ``nn.Linear`` of the model but its output embedding (``lm_head``): vision tower, projector and language
    model, peft's ``target_modules="all-linear"`` rule (FOCUS's train_sft.py) as an explicit list."""
    import torch
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if not names:
        raise AdapterError(f"{type(model).__name__}: no linear modules to adapt")
    return names


def target_linears(model, targets: str) -> list[str]:
    """The modules LoRA adapts under ``lora.train.targets``: ``language_model`` (ours) or ``all_linear`` (FOCUS)."""
    if targets == "language_model":
        return language_model_linears(model)
    if targets == "all_linear":
        return all_linears(model)
    raise ValueError(f"lora.train.targets must be language_model or all_linear, got {targets!r}")


FOCUS_MODULES_TO_SAVE = ("lm_head", "embed_tokens")


def modules_to_save(settings: LoraSettings, entry: dict | None) -> list[str] | None:
    """Modules trained in full beside LoRA: none (ours) or FOCUS's ``lm_head`` and ``embed_tokens``, which its
    train_sft.py leaves out for a pure Llama model (a hub id holding ``llama`` and not ``llava``)."""
    if settings.modules_to_save == "none":
        return None
    hub = str((entry or {}).get("hub_id") or (entry or {}).get("name") or "").lower()
    if "llama" in hub and "llava" not in hub:
        return None
    return list(FOCUS_MODULES_TO_SAVE)


def lora_config(settings: LoraSettings, model, entry: dict | None = None):
    from peft import LoraConfig
    # An explicit list of full names (peft matches a name that equals or ends with an entry): exactly the modules
    # of settings.targets, recorded in adapter_config.json for the load-time check.
    return LoraConfig(r=int(settings.r), lora_alpha=int(settings.alpha), lora_dropout=float(settings.dropout),
                      bias="none", target_modules=target_linears(model, settings.targets),
                      modules_to_save=modules_to_save(settings, entry), task_type="CAUSAL_LM")


__all__ = ["FOCUS_MODULES_TO_SAVE", "all_linears", "language_model_linears", "language_model_prefix", "lora_config",
           "modules_to_save", "target_linears"]
