"""``retinabench check-encoder``: load one entry through the real load path and report what happened (its image
encoder, its dual encoder where it declares zero-shot, its MLLM where it declares the mllm interface)."""
from __future__ import annotations

from pathlib import Path


def _weights_lines(w: dict) -> list[str]:
    """Where the loaded weights came from and the sha256 of each file, as the check report prints them."""
    hub = f" {w['hub_id']}@{w['revision']}" if w.get("hub_id") else ""
    return [f"  weights: {w.get('origin')}{hub}"] + [f"    {f}  sha256 {sha}"
                                                    for f, sha in sorted((w.get("files") or {}).items())]


def check_encoder(entry: dict, weights: str | Path | None = None) -> tuple[bool, list[str]]:
    """Build ``entry`` (from its pinned source, or ``weights``: a local file / folder in the published layout)
    and describe the result: embedding dimension, files and sha256, dropped / missing / unexpected keys."""
    from retinabench.models.strict import WeightsError
    from retinabench.models.encoder import build_encoder
    from retinabench.registry.lockfile import LockError
    if "mllm" in (entry.get("interfaces") or []):
        return check_mllm(entry, weights)
    lines = [f"encoder {entry['name']} ({entry['source']} {entry['architecture']}, pooling {entry['pooling']}, "
             f"input {entry['input_size']}px)"]
    try:
        enc = build_encoder(entry, weights=weights)
    except WeightsError as err:
        rep = err.report
        lines.append(f"  FAILED: {err}")
        if rep is not None:
            lines += [f"  missing keys ({len(rep.missing)}): {rep.missing}",
                      f"  unexpected keys ({len(rep.unexpected)}): {rep.unexpected}",
                      f"  shape mismatches ({len(rep.shape_mismatch)}): {rep.shape_mismatch}",
                      f"  dropped keys ({len(rep.dropped)}): {sorted(rep.dropped)[:20]}"]
        return False, lines
    except (LockError, OSError, KeyError, ValueError) as err:
        lines.append(f"  FAILED: {type(err).__name__}: {err}")
        return False, lines
    w = enc.weights
    lines += _weights_lines(w)
    dropped = w.get("dropped") or {"count": 0}
    lines.append(f"  dropped keys ({dropped['count']}): " + (str(dropped.get("keys")) if "keys" in dropped
                                                              else str(dropped.get("groups"))))
    lines.append("  missing keys (0): []")
    lines.append("  unexpected keys (0): []")
    for t in w.get("transforms") or []:
        lines.append(f"  transform: {t}")
    if w.get("pipeline_checked"):
        lines.append(f"  normalisation / input size agree with: {', '.join(w['pipeline_checked'])}")
    lines.append(f"  embedding dimension: {enc.embed_dim} (declared {entry.get('embed_dim', 'not declared')})")
    if "zeroshot" in (entry.get("interfaces") or []):
        ok, more = check_text_tower(entry, weights)
        lines += more
        if not ok:
            return False, lines
    lines.append("  OK")
    return True, lines


def check_text_tower(entry: dict, weights: str | Path | None = None) -> tuple[bool, list[str]]:
    """The zero-shot side of a dual encoder: both towers and the tokenizer through the strict loader, the head
    the ``zeroshot`` protocol uses (learned logit scale, SigLIP bias), and one image and one text embedded into
    the same space."""
    from retinabench.models.strict import WeightsError
    from retinabench.models.dual_encoder import load_dual_encoder
    from retinabench.registry.lockfile import LockError
    lines = ["  zero-shot (both towers, tokenizer):"]
    try:
        dual = load_dual_encoder(entry, weights=weights)
        import torch
        dual.module.eval()
        with torch.inference_mode():
            text = dual.encode_text(["a colour fundus photograph of a retina"]).float().cpu().numpy()
            image = dual.encode_image(torch.zeros(1, 3, dual.input_size, dual.input_size)).float().cpu().numpy()
    except (WeightsError, LockError, OSError, KeyError, ValueError, ImportError) as err:
        lines.append(f"    FAILED: {type(err).__name__}: {err}")
        return False, lines
    head = (f"softmax(logit_scale {dual.logit_scale:.4g} x cos)" if dual.logit_bias is None else
            f"sigmoid(logit_scale {dual.logit_scale:.4g} x cos + logit_bias {dual.logit_bias:.4g})")
    lines.append(f"    {dual.family} family, head {head}; FOCUS scoring: softmax(100 x cos)")
    if text.shape[-1] != image.shape[-1]:
        lines.append(f"    FAILED: text embedding dimension {text.shape[-1]} != image {image.shape[-1]}")
        return False, lines
    lines.append(f"    shared embedding dimension: {text.shape[-1]}")
    return True, lines


def check_mllm(entry: dict, weights: str | Path | None = None) -> tuple[bool, list[str]]:
    """Load an image-text-to-text entry (model + processor, strictly, from its pinned files or ``weights``) and
    report the files, the keys and the yes/no answer tokens its tokenizer gives the MLLM protocols."""
    from retinabench.models.strict import WeightsError
    from retinabench.models.mllm import load_mllm
    from retinabench.registry.lockfile import LockError
    lines = [f"mllm {entry['name']} ({entry['source']} {entry.get('hf_full_class')}, {entry['architecture']})"]
    try:
        m = load_mllm(entry, weights=weights, device="cpu", dtype="auto")
    except WeightsError as err:
        lines.append(f"  FAILED: {err}")
        if err.report is not None:
            lines += [f"  missing keys ({len(err.report.missing)}): {err.report.missing[:20]}",
                      f"  unexpected keys ({len(err.report.unexpected)}): {err.report.unexpected[:20]}"]
        return False, lines
    except (LockError, OSError, KeyError, ValueError) as err:
        lines.append(f"  FAILED: {type(err).__name__}: {err}")
        return False, lines
    w = m.weights
    lines += _weights_lines(w)
    lines.append(f"  processor: {type(m.processor).__name__}, chat template: "
                 f"{'yes' if getattr(m.processor, 'chat_template', None) else 'NO'}")
    lines.append(f"  yes/no tokens counted: {sorted(m.tokens.counted, key=repr)}; excluded: "
                 f"{dict(sorted(m.tokens.excluded.items()))}")
    n = sum(p.numel() for p in m.model.parameters()) / 1e6
    lines.append(f"  parameters: {n:.1f} M (declared {entry.get('params_m', 'not declared')})")
    lines.append("  OK")
    return True, lines
