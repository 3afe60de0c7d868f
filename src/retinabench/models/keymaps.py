"""State-dict key maps: a published checkpoint's layout -> the library architecture it loads into, and back.

Each map is a pair of pure functions over whole state dicts: ``forward(published) -> architecture`` (used by every
load) and ``inverse(architecture) -> published`` (used by the offline tests to write a file in the published
layout from an architecture built with random weights, so each map is pinned without a download). A map renames
keys (and, where a layout needs it, merges tensors); it never drops a key silently: a key it cannot map raises
:class:`KeyError` naming it, and two keys mapped onto one raise too. Keys a checkpoint carries that the encoder
does not use are dropped by the *entry* (``drop_keys`` / ``keep_prefix``), so the drop is declared and recorded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class KeyMap:
    name: str
    forward: Callable[[dict], dict]
    inverse: Callable[..., dict]
    doc: str


def _rename_all(state_dict: dict, fn: Callable[[str], str], name: str) -> dict:
    out = {}
    for k, v in state_dict.items():
        new = fn(k)
        if new in out:
            raise KeyError(f"key_map {name!r} maps two keys onto {new!r}")
        out[new] = v
    return out


# --- lukemelas/EfficientNet-PyTorch names -> timm efficientnet_lite0 -------------------------------------------
_LITE0_DEPTHS = (1, 2, 2, 3, 3, 4, 1)  # blocks per stage, as in timm's efficientnet_lite0
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_FIRST_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_BLOCK = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
          "_project_conv": "conv_pwl", "_bn2": "bn3"}
_BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(\w+)\.(.+)$")
_TIMM_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(\d+)\.(\w+)\.(.+)$")
_POSITIONS = [(stage, b) for stage, depth in enumerate(_LITE0_DEPTHS) for b in range(depth)]


def lukemelas_efficientnet_lite0(key: str) -> str:
    """``_blocks.N._expand_conv.weight`` -> ``blocks.S.B.conv_pw.weight`` (timm ``efficientnet_lite0``)."""
    m = _BLOCK_KEY.match(key)
    if m:
        n, layer, rest = int(m[1]), m[2], m[3]
        if n >= len(_POSITIONS):
            raise KeyError(f"block index {n} beyond EfficientNet-Lite0's {len(_POSITIONS)} blocks in key {key!r}")
        stage, b = _POSITIONS[n]
        table = _FIRST_BLOCK if n == 0 else _BLOCK
        if layer not in table:
            raise KeyError(f"no mapping for layer {layer!r} in key {key!r}")
        return f"blocks.{stage}.{b}.{table[layer]}.{rest}"
    head, _, rest = key.partition(".")
    if head not in _TOP:
        raise KeyError(f"no mapping for key {key!r}")
    return f"{_TOP[head]}.{rest}"


def lukemelas_efficientnet_lite0_inverse(key: str) -> str:
    m = _TIMM_BLOCK_KEY.match(key)
    if m:
        stage, b, layer, rest = int(m[1]), int(m[2]), m[3], m[4]
        if (stage, b) not in _POSITIONS:
            raise KeyError(f"no EfficientNet-Lite0 block at stage {stage}, index {b} (key {key!r})")
        n = _POSITIONS.index((stage, b))
        table = {v: k for k, v in (_FIRST_BLOCK if n == 0 else _BLOCK).items()}
        if layer not in table:
            raise KeyError(f"no inverse mapping for layer {layer!r} in key {key!r}")
        return f"_blocks.{n}.{table[layer]}.{rest}"
    head, _, rest = key.partition(".")
    top = {v: k for k, v in _TOP.items()}
    if head not in top:
        raise KeyError(f"no inverse mapping for key {key!r}")
    return f"{top[head]}.{rest}"


# --- official DINOv2 (facebookresearch/dinov2 training code) -> timm vit_*_dinov2 -------------------------------
_CHUNKED_BLOCK = re.compile(r"^blocks\.\d+\.(\d+)\.(.+)$")
_DINOV2_UNSUPPORTED = ("register_tokens", "mask_token")


def _dinov2_official_forward(state_dict: dict) -> dict:
    """Chunked blocks (``blocks.<chunk>.<i>.``, FSDP training checkpoints) become ``blocks.<i>.``; every other
    key of a plain-MLP ViT is already timm's (``ls1.gamma``, ``attn.qkv``, ``mlp.fc1`` ...). Registers and the
    mask token have no place in the architecture: the entry must drop them (they are refused here, by name)."""
    for bad in _DINOV2_UNSUPPORTED:
        if bad in state_dict:
            raise KeyError(f"key_map 'dinov2_official': key {bad!r} has no counterpart in timm's ViT; "
                           f"declare it in the entry's drop_keys (mask_token) or use a register-aware map")

    def rename(k: str) -> str:
        m = _CHUNKED_BLOCK.match(k)
        return f"blocks.{m[1]}.{m[2]}" if m else k

    return _rename_all(state_dict, rename, "dinov2_official")


def _identity_inverse(state_dict: dict, rng: torch.Generator | None = None) -> dict:
    return dict(state_dict)


# --- RetiZero: RETFound ViT-L wrapped in LoRA_ViT (q and v adapters on every block) -> plain timm ViT-L ---------
_LORA_QKV = re.compile(r"^blocks\.(\d+)\.attn\.qkv\.qkv\.(weight|bias)$")
_LORA_FACTOR = re.compile(r"^blocks\.(\d+)\.attn\.qkv\.linear_([ab])_([qv])\.weight$")


def _retizero_lora_forward(state_dict: dict) -> dict:
    """Merge each block's LoRA factors into its qkv projection: RetiZero's ``_LoRA_qkv`` adds ``B_q(A_q(x))`` to
    the query third and ``B_v(A_v(x))`` to the value third of ``qkv(x)``, i.e. ``W_q += B_q @ A_q`` and
    ``W_v += B_v @ A_v`` (no scaling). The result is a plain ViT whose output equals the adapted model's."""
    out, factors = {}, {}
    for k, v in state_dict.items():
        m = _LORA_FACTOR.match(k)
        if m:
            factors[(int(m[1]), m[2], m[3])] = v
            continue
        m = _LORA_QKV.match(k)
        new = f"blocks.{m[1]}.attn.qkv.{m[2]}" if m else k
        if new in out:
            raise KeyError(f"key_map 'retizero_lora' maps two keys onto {new!r}")
        out[new] = v
    blocks = sorted({b for b, _, _ in factors})
    for b in blocks:
        need = [(b, ab, qv) for ab in "ab" for qv in "qv"]
        missing = [f"blocks.{b}.attn.qkv.linear_{ab}_{qv}.weight" for (_, ab, qv) in need if (b, ab, qv) not in factors]
        if missing:
            raise KeyError(f"key_map 'retizero_lora': block {b} lacks LoRA factors {missing}")
        key = f"blocks.{b}.attn.qkv.weight"
        if key not in out:
            raise KeyError(f"key_map 'retizero_lora': LoRA factors for block {b} but no {key!r}")
        w = out[key].clone()
        dim = w.shape[1]
        w[:dim] += factors[(b, "b", "q")] @ factors[(b, "a", "q")]
        w[-dim:] += factors[(b, "b", "v")] @ factors[(b, "a", "v")]
        out[key] = w
    return out


def _retizero_lora_inverse(state_dict: dict, rng: torch.Generator | None = None, rank: int = 8) -> dict:
    """A published-layout dict whose merge gives ``state_dict`` back: with ``rng`` the LoRA factors are random and
    the stored qkv weight is the merged weight minus their product; without it they are zero (cheap, exact)."""
    out = {}
    for k, v in state_dict.items():
        m = re.match(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", k)
        if not m:
            out[k] = v
            continue
        out[f"blocks.{m[1]}.attn.qkv.qkv.{m[2]}"] = v
        if m[2] != "weight":
            continue
        dim = v.shape[1]
        factors = {}
        for qv in "qv":
            if rng is None:
                a = torch.zeros((), dtype=v.dtype).expand(rank, dim)
                b = torch.zeros((), dtype=v.dtype).expand(dim, rank)
            else:
                a = torch.randn(rank, dim, generator=rng, dtype=v.dtype) * 0.02
                b = torch.randn(dim, rank, generator=rng, dtype=v.dtype) * 0.02
            factors[qv] = (a, b)
            out[f"blocks.{m[1]}.attn.qkv.linear_a_{qv}.weight"] = a
            out[f"blocks.{m[1]}.attn.qkv.linear_b_{qv}.weight"] = b
        if rng is not None:
            w = v.clone()
            w[:dim] -= factors["q"][1] @ factors["q"][0]
            w[-dim:] -= factors["v"][1] @ factors["v"][0]
            out[f"blocks.{m[1]}.attn.qkv.qkv.weight"] = w
    return out


KEYMAPS: dict[str, KeyMap] = {}


# --- MIRAGE (j-morano/MIRAGE, a MultiMAE ViT) -> timm ViT (no class token, 1 register token, no final norm) ---
# The B-scan input adapter is the image tower: a 1-channel patch projection plus a fixed 2D sin-cos position grid
# (1, D, h, w); the global token (appended after the patch tokens in MIRAGE, prepended as a register token by
# timm: attention is order-free and neither carries a position) and the encoder blocks (timm's block names).
# MIRAGE's own reader feeds the first channel of a PNG/JPEG (mirage_wrapper.to_tensor: img[..., 0]) in [0, 1]:
# the projection is widened to RGB with the weights on channel 0 and zeros elsewhere, the same numbers on any
# image, grey or not.
_MIRAGE_BLOCK = re.compile(r"^encoder\.(\d+)\.(.+)$")
_MIRAGE_TOP = {"input_adapters.bscan.proj.weight": "patch_embed.proj.weight",
               "input_adapters.bscan.proj.bias": "patch_embed.proj.bias",
               "input_adapters.bscan.pos_emb": "pos_embed", "global_tokens": "reg_token"}


def _mirage_forward(state_dict: dict) -> dict:
    def rename(k: str) -> str:
        m = _MIRAGE_BLOCK.match(k)
        if m:
            return f"blocks.{m[1]}.{m[2]}"
        if k in _MIRAGE_TOP:
            return _MIRAGE_TOP[k]
        raise KeyError(f"key_map 'mirage_multimae': no mapping for key {k!r} (other input and output adapters "
                       f"belong in the entry's drop_keys)")

    out = _rename_all(state_dict, rename, "mirage_multimae")
    if "pos_embed" in out:  # (1, D, h, w) -> (1, h*w, D), row-major as MIRAGE flattens it
        grid = out["pos_embed"]
        out["pos_embed"] = grid.flatten(2).transpose(1, 2).contiguous()
    if "patch_embed.proj.weight" in out:
        w = out["patch_embed.proj.weight"]
        if w.shape[1] != 1:
            raise KeyError(f"key_map 'mirage_multimae': the B-scan projection has {w.shape[1]} input channels, "
                           f"expected 1")
        out["patch_embed.proj.weight"] = torch.cat([w, torch.zeros_like(w), torch.zeros_like(w)], dim=1)
    return out


def _mirage_inverse(state_dict: dict, rng: torch.Generator | None = None) -> dict:
    inv = {v: k for k, v in _MIRAGE_TOP.items()}

    def rename(k: str) -> str:
        if k.startswith("blocks."):
            return "encoder." + k[len("blocks."):]
        if k in inv:
            return inv[k]
        raise KeyError(f"no inverse mapping for key {k!r}")

    out = _rename_all(state_dict, rename, "mirage_multimae")
    pos = out["input_adapters.bscan.pos_emb"]
    side = int(round(pos.shape[1] ** 0.5))
    out["input_adapters.bscan.pos_emb"] = pos.transpose(1, 2).reshape(1, pos.shape[2], side, side)
    out["input_adapters.bscan.proj.weight"] = out["input_adapters.bscan.proj.weight"][:, :1]
    return out


def _register(km: KeyMap) -> None:
    if km.name in KEYMAPS:
        raise ValueError(f"key_map {km.name!r} registered twice")
    KEYMAPS[km.name] = km


_register(KeyMap(
    "lukemelas_efficientnet_lite0",
    lambda sd: _rename_all(sd, lukemelas_efficientnet_lite0, "lukemelas_efficientnet_lite0"),
    lambda sd, rng=None: _rename_all(sd, lukemelas_efficientnet_lite0_inverse, "lukemelas_efficientnet_lite0"),
    "lukemelas/EfficientNet-PyTorch names (_blocks.N._expand_conv) -> timm efficientnet_lite0"))
_register(KeyMap(
    "dinov2_official", _dinov2_official_forward, _identity_inverse,
    "facebookresearch/dinov2 training layout (plain MLP; chunked blocks flattened) -> timm vit_*_dinov2"))
_register(KeyMap(
    "retizero_lora", _retizero_lora_forward, _retizero_lora_inverse,
    "RetiZero LoRA_ViT (qkv.qkv + linear_{a,b}_{q,v}) -> timm ViT with the LoRA update merged into qkv"))
_register(KeyMap(
    "mirage_multimae", _mirage_forward, _mirage_inverse,
    "MIRAGE MultiMAE (B-scan input adapter, global token, encoder.N) -> timm ViT, projection widened to RGB"))


def get_keymap(name: str) -> KeyMap:
    try:
        return KEYMAPS[name]
    except KeyError:
        raise KeyError(f"unknown key_map {name!r}; known: {sorted(KEYMAPS)}") from None


def apply_keymap(state_dict: dict, name: str) -> dict:
    return get_keymap(name).forward(state_dict)


def invert_keymap(state_dict: dict, name: str, rng: torch.Generator | None = None) -> dict:
    return get_keymap(name).inverse(state_dict, rng=rng)
