"""State-dict key mappings for checkpoints whose layout differs from the library architecture they load into.

Each mapping is a pure function ``old_key -> new_key``; :func:`apply_keymap` fails on collisions so a wrong
mapping can never silently overwrite weights.
"""
from __future__ import annotations

import re
from typing import Callable

# EfficientNet-Lite0 stage depths (blocks per stage), as in timm's efficientnet_lite0.
_LITE0_DEPTHS = (1, 2, 2, 3, 3, 4, 1)
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_FIRST_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_BLOCK = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
          "_project_conv": "conv_pwl", "_bn2": "bn3"}
_BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(\w+)\.(.+)$")


def _block_positions(depths):
    pos = []
    for stage, depth in enumerate(depths):
        pos.extend((stage, b) for b in range(depth))
    return pos


def lukemelas_efficientnet_lite0(key: str) -> str:
    """lukemelas/EfficientNet-PyTorch-style names (``_blocks.N._expand_conv``) -> timm ``efficientnet_lite0``."""
    m = _BLOCK_KEY.match(key)
    if m:
        n, layer, rest = int(m[1]), m[2], m[3]
        positions = _block_positions(_LITE0_DEPTHS)
        if n >= len(positions):
            raise KeyError(f"block index {n} beyond EfficientNet-Lite0's {len(positions)} blocks in key {key!r}")
        stage, b = positions[n]
        table = _FIRST_BLOCK if n == 0 else _BLOCK
        if layer not in table:
            raise KeyError(f"no mapping for layer {layer!r} in key {key!r}")
        return f"blocks.{stage}.{b}.{table[layer]}.{rest}"
    head, _, rest = key.partition(".")
    if head not in _TOP:
        raise KeyError(f"no mapping for key {key!r}")
    return f"{_TOP[head]}.{rest}"


KEYMAPS: dict[str, Callable[[str], str]] = {
    "lukemelas_efficientnet_lite0": lukemelas_efficientnet_lite0,
}


def apply_keymap(state_dict: dict, name: str) -> dict:
    try:
        fn = KEYMAPS[name]
    except KeyError:
        raise KeyError(f"unknown key_map {name!r}; known: {sorted(KEYMAPS)}") from None
    out = {}
    for k, v in state_dict.items():
        new = fn(k)
        if new in out:
            raise KeyError(f"key_map {name!r} maps two keys onto {new!r}")
        out[new] = v
    return out
