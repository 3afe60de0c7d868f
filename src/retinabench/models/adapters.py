"""LoRA adapters of MLLMs: strict loading onto a base model and the provenance sidecar that loading verifies
(:mod:`retinabench.protocols.lora` trains them; :mod:`retinabench.protocols.mllm` names their predictions).

Loading (:func:`load_adapter`) verifies the adapter against its provenance sidecar before it touches the model:
files present with the recorded sha256, the recorded base model (name, class, weight-file sha256s) equal to the
one loaded, every LoRA tensor mapped onto an existing linear module with matching shapes, and every tensor of
the file loaded. Any mismatch is an :class:`AdapterError`; nothing falls back to the base model (FOCUS's loader
catches the exception and evaluates the base).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from retinabench.models.mllm import MLLM

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class AdapterError(ValueError):
    """An adapter folder that does not fit the base model it is loaded onto (or is incomplete / altered)."""


def base_record(mllm: MLLM, entry: dict | None = None) -> dict:
    """What identifies the base model an adapter belongs to: registry name, model class, weight-file sha256s
    (weights and config; tokenizer / template files excluded), hub id and revision where loaded from the hub."""
    files = {k: v for k, v in (mllm.weights.get("files") or {}).items()
             if k.endswith((".safetensors", ".bin", ".pt", ".pth")) or k == "config.json"}
    rec: dict[str, Any] = {"name": mllm.name, "class": type(_unwrap(mllm.model)).__name__, "files": files}
    for k in ("hub_id", "revision"):
        if mllm.weights.get(k) or (entry or {}).get(k):
            rec[k] = mllm.weights.get(k) or (entry or {}).get(k)
    return rec


def name_base_model(peft_model, name: str) -> None:
    """Name the base model by its identity (registry entry or hub id) instead of the temporary folder the strict
    loader read it from, before saving: the adapter's files (and their digest) then depend on the training only,
    so the same config gives the same adapter bytes."""
    peft_model.peft_config["default"].base_model_name_or_path = name   # adapter_config.json
    peft_model.get_base_model().config.name_or_path = name             # the model card (README.md) ...
    peft_model.get_base_model().name_or_path = name                    # ... and its tags


def _unwrap(model):
    from peft import PeftModel
    return model.get_base_model() if isinstance(model, PeftModel) else model


def write_adapter_sidecar(adapter_dir: str | os.PathLike, record: dict, *, rule: str = "mllm_lora_train",
                          inputs: Sequence[str | os.PathLike] = (), wildcards: dict | None = None,
                          config: dict | None = None) -> Path:
    """The adapter folder's provenance sidecar ``<adapter>.prov.json``: every file with its sha256 (the folder
    form of :func:`retinabench.provenance.write_sidecar`) and, under ``extra.adapter``, the base-model record,
    source dataset and task, prompt set, settings and compute from the training run's record
    (:func:`retinabench.protocols.lora.train_lora`); :func:`verify_adapter_files` reads it back."""
    from retinabench.provenance import write_sidecar
    keep = ("base", "settings", "prompt_set", "task", "dataset", "n_examples", "examples_sha256", "target_modules",
            "compute", "batch_size", "grad_accum", "world_size", "effective_batch")
    return write_sidecar(adapter_dir, rule=rule, inputs=inputs, wildcards=wildcards, config=config,
                         seed=record.get("settings", {}).get("seed"),
                         extra={"adapter": {k: record.get(k) for k in keep}})


@dataclass(frozen=True)
class AdapterInfo:
    path: str
    sha256: str           # the folder digest recorded in the sidecar
    base: dict
    task: str | None
    dataset: str | None
    prompt_set: str | None
    record: dict


def verify_adapter_files(adapter_dir: str | os.PathLike) -> AdapterInfo:
    """The adapter folder checked against its sidecar (present, every recorded file with its sha256, no
    unrecorded weight file); returns what the sidecar says of it."""
    from retinabench.hashing import SNAKEMAKE_MARKER, sha256_file
    from retinabench.provenance import read_sidecar, sidecar_path
    d = Path(adapter_dir)
    if not d.is_dir():
        raise AdapterError(f"adapter folder {d} does not exist")
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (d / name).is_file():
            raise AdapterError(f"adapter {d}: missing file {name}")
    if not sidecar_path(d).is_file():
        raise AdapterError(f"adapter {d}: no provenance sidecar {sidecar_path(d)} (its files cannot be verified)")
    rec = read_sidecar(d)
    files = rec.get("files") or {}
    info = (rec.get("extra") or {}).get("adapter") or {}
    if not files or not info.get("base"):
        raise AdapterError(f"adapter {d}: sidecar {sidecar_path(d)} lacks the file list or the base-model record")
    for name, sha in files.items():
        p = d / name
        if not p.is_file():
            raise AdapterError(f"adapter {d}: missing file {name} (recorded in its sidecar)")
        if sha256_file(p) != sha:
            raise AdapterError(f"adapter {d}: file {name} has sha256 {sha256_file(p)[:12]}..., the sidecar records "
                               f"{sha[:12]}... (changed after training)")
    unrecorded = sorted(p.name for p in d.iterdir() if p.is_file() and p.name not in files
                        and p.name != SNAKEMAKE_MARKER)
    if unrecorded:
        raise AdapterError(f"adapter {d}: files {unrecorded} are not recorded in its sidecar")
    return AdapterInfo(str(d), rec["sha256"], info["base"], info.get("task"), info.get("dataset"),
                       info.get("prompt_set"), info)


def _check_base(info: AdapterInfo, mllm: MLLM) -> None:
    want, have = info.base, base_record(mllm)
    where = f"adapter {info.path}"
    if want.get("name") != have["name"]:
        raise AdapterError(f"{where} was trained on base model {want.get('name')!r}, not {have['name']!r}")
    if want.get("class") != have["class"]:
        raise AdapterError(f"{where}: base model class {want.get('class')!r} recorded, {have['class']!r} loaded")
    for k in ("hub_id", "revision"):
        if want.get(k) and have.get(k) and want[k] != have[k]:
            raise AdapterError(f"{where}: base {k} {want[k]!r} recorded, {have[k]!r} loaded")
    wf, hf = want.get("files") or {}, have.get("files") or {}
    differ = sorted(f for f in set(wf) | set(hf) if wf.get(f) != hf.get(f))
    if differ:
        raise AdapterError(f"{where}: the base model's weight files differ from those it was trained on: "
                           + ", ".join(f"{f} (recorded {str(wf.get(f))[:12]}, loaded {str(hf.get(f))[:12]})"
                                       for f in differ))


def _is_saved_module_tensor(stem: str, saved: list[str] | set[str] | None) -> bool:
    """``stem`` (``<module>.<param>``) belongs to a module named by ``modules_to_save`` (peft matches the module
    name or its last components, as ``ModulesToSaveWrapper`` does)."""
    module = stem.rsplit(".", 1)[0]
    return any(module == m or module.endswith("." + m) for m in (saved or []))


def _check_saved_modules(d: Path, model, full: dict[str, tuple], saved: list[str] | set[str] | None) -> None:
    """Every parameter of every module the config saves in full is in the file, with the model's shape, and
    nothing else is."""
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied lm_head is saved under its own name
    want = {n: tuple(p.shape) for n, p in params.items() if _is_saved_module_tensor(n, saved)}
    if set(full) != set(want):
        raise AdapterError(f"adapter {d}: modules_to_save {list(saved or [])}: the model has {len(want)} such "
                           f"parameters, the file {len(full)} (missing: {sorted(set(want) - set(full))[:3]}, "
                           f"not in the model: {sorted(set(full) - set(want))[:3]})")
    bad = sorted(n for n in full if full[n] != want[n])
    if bad:
        raise AdapterError(f"adapter {d}: saved module weight {bad[0]!r} has shape {full[bad[0]]}, the model's is "
                           f"{want[bad[0]]}")


def _check_modules(d: Path, model) -> dict:
    """Every LoRA tensor of the file maps onto a linear module of ``model`` with matching shapes, and the
    modules the config targets are exactly those the file has weights for. Runs before the model is touched."""
    import torch
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from safetensors import safe_open
    cfg_dict = json.loads((d / ADAPTER_CONFIG).read_text())
    try:
        cfg = LoraConfig.from_pretrained(str(d))
    except (TypeError, ValueError) as err:
        raise AdapterError(f"adapter {d}: {ADAPTER_CONFIG} is not a LoRA config: {err}") from None
    if cfg_dict.get("peft_type") != "LORA":
        raise AdapterError(f"adapter {d}: peft_type {cfg_dict.get('peft_type')!r}, expected LORA")
    modules = dict(model.named_modules())
    tensors = {}
    with safe_open(str(d / ADAPTER_WEIGHTS), "pt") as f:
        for k in f.keys():
            tensors[k] = tuple(f.get_slice(k).get_shape())
    by_module: dict[str, dict[str, tuple]] = {}
    full: dict[str, tuple] = {}  # modules_to_save: whole modules trained in full (FOCUS's lm_head / embed_tokens)
    for key, shape in tensors.items():
        stem = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
        for part in (".lora_A.weight", ".lora_B.weight"):
            if stem.endswith(part):
                by_module.setdefault(stem[: -len(part)], {})[part[1:7]] = shape
                break
        else:
            if not _is_saved_module_tensor(stem, cfg.modules_to_save):
                raise AdapterError(f"adapter {d}: tensor {key!r} is neither a LoRA A/B weight nor a weight of the "
                                   f"config's modules_to_save {list(cfg.modules_to_save or [])} (bias, DoRA or "
                                   "embedding adapters are not what retinabench trains)")
            full[stem] = shape
    _check_saved_modules(d, model, full, cfg.modules_to_save)
    lacking = sorted(m for m in by_module if m not in modules)
    if lacking:
        raise AdapterError(f"adapter {d}: {len(lacking)} adapted modules do not exist in {type(model).__name__}, "
                           f"e.g. {lacking[:3]}")
    for name, parts in sorted(by_module.items()):
        mod = modules[name]
        if not isinstance(mod, torch.nn.Linear):
            raise AdapterError(f"adapter {d}: adapted module {name!r} is a {type(mod).__name__}, not a linear layer")
        if set(parts) != {"lora_A", "lora_B"}:
            raise AdapterError(f"adapter {d}: module {name!r} has only {sorted(parts)}")
        a, b = parts["lora_A"], parts["lora_B"]
        if a != (cfg.r, mod.in_features) or b != (mod.out_features, cfg.r):
            raise AdapterError(f"adapter {d}: module {name!r} has LoRA shapes A{a} B{b}; the model's layer "
                               f"({mod.in_features} -> {mod.out_features}, r {cfg.r}) needs "
                               f"A{(cfg.r, mod.in_features)} B{(mod.out_features, cfg.r)}")
    targeted = sorted(n for n, m in modules.items() if n and isinstance(m, torch.nn.Linear)
                      and check_target_module_exists(cfg, n))
    if set(targeted) != set(by_module):
        extra, absent = sorted(set(targeted) - set(by_module)), sorted(set(by_module) - set(targeted))
        raise AdapterError(f"adapter {d}: its config targets {len(targeted)} modules of this model, its weights "
                           f"cover {len(by_module)} (targeted without weights: {extra[:3]}, weights outside the "
                           f"targets: {absent[:3]})")
    return tensors


def load_adapter(mllm: MLLM, adapter_dir: str | os.PathLike) -> MLLM:
    """``mllm`` with the verified adapter applied (peft, inference mode): a new :class:`MLLM` of the same name
    whose ``weights`` record carries the adapter record. Every check runs before the base model is modified;
    any failure is an :class:`AdapterError` naming the file or module. The base ``mllm`` must not be used
    afterwards (peft injects the LoRA layers into its modules)."""
    import torch
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file
    if isinstance(mllm.model, PeftModel):
        raise AdapterError(f"{mllm.name}: the model already carries an adapter; load the base model afresh")
    info = verify_adapter_files(adapter_dir)
    _check_base(info, mllm)
    d = Path(adapter_dir)
    tensors = _check_modules(d, mllm.model)
    try:
        model = PeftModel.from_pretrained(mllm.model, str(d), is_trainable=False)
    except (RuntimeError, ValueError, KeyError) as err:
        raise AdapterError(f"adapter {d}: peft could not load it onto {type(mllm.model).__name__}: {err}") from err
    loaded = get_peft_model_state_dict(model)
    if set(loaded) != set(tensors):
        raise AdapterError(f"adapter {d}: {len(set(tensors) - set(loaded))} file tensors were not loaded and "
                           f"{len(set(loaded) - set(tensors))} adapter parameters got no tensor")
    saved = load_file(str(d / ADAPTER_WEIGHTS))
    for k, v in saved.items():
        if not torch.equal(loaded[k].detach().to("cpu", v.dtype), v):
            raise AdapterError(f"adapter {d}: tensor {k} differs from the file after loading")
    model.to(mllm.device)
    model.eval()
    return dataclasses.replace(mllm, model=model, weights={**mllm.weights, "adapter": {
        "path": info.path, "sha256": info.sha256, "task": info.task, "dataset": info.dataset,
        "prompt_set": info.prompt_set, "base": info.base}})
