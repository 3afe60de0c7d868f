"""Training augmentations of the fine-tuning protocols, seeded per sample.

The paper's list: random resized crop with scale 0.8–1.2, rotation ±5°, horizontal and vertical flips, colour
jitter (brightness/contrast 0.2, saturation/hue 0.1). torchvision's ``RandomResizedCrop`` cannot take a crop
*larger* than the image (a scale > 1 silently falls back to the whole image), so the crop is implemented as what
it means geometrically: a crop covering a fraction ``s ~ U(scale)`` of the image area, resized back to the full
size, is a zoom by ``1/sqrt(s)`` about the crop centre (``s > 1`` zooms out; the border is black, the background
of fundus and OCT images anyway). The crop centre is uniform over the positions where a crop of area
``min(s, 1)`` fits. Zoom, shift and rotation are one affine warp (a single bilinear interpolation); the aspect
ratio is kept. Flips follow, then colour jitter in a random order per sample (as ``v2.ColorJitter``).

Every random number of a sample comes from :func:`draw_params` with that sample's seed, so two paths give the
same augmentation:

* :class:`Augment` — one uint8 CHW image at a time with ``torchvision.transforms.v2.functional`` ops (in the
  DataLoader; the reference, and the CPU default);
* :func:`augment_batch` — the same operations batched on the training device in float (the CUDA default, so
  CPU data-loader workers are not the bottleneck of a GPU step). It equals the reference up to interpolation and
  uint8 rounding (tests pin the tolerance).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.transforms.functional import _get_inverse_affine_matrix
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF
from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

from retinabench.settings.finetune import AugmentSettings

JITTER = ("brightness", "contrast", "saturation", "hue")


def settings_of(aug: AugmentSettings | dict | None) -> AugmentSettings:
    """The typed augmentation settings (a partial dict gets the defaults; unknown keys fail)."""
    return aug if isinstance(aug, AugmentSettings) else AugmentSettings.of(aug, "finetune.augment")


def draw_params(a: AugmentSettings, seed: int) -> dict:
    """All random numbers of one sample's augmentation, from its own generator."""
    g = torch.Generator().manual_seed(int(seed))
    r = torch.rand(10, generator=g, dtype=torch.float64).tolist()
    order = torch.randperm(4, generator=g).tolist()
    lo, hi = float(a.scale[0]), float(a.scale[1])
    s = lo + (hi - lo) * r[0]
    side = math.sqrt(min(s, 1.0))  # crop side / image side; a crop larger than the image is centred
    return {"area": s, "angle": float(a.rotation) * (2.0 * r[1] - 1.0),
            "cx": (1.0 - side) * (r[2] - 0.5), "cy": (1.0 - side) * (r[3] - 0.5),  # crop centre, image fractions
            "hflip": r[4] < a.hflip, "vflip": r[5] < a.vflip, "order": order,
            "brightness": 1.0 + a.brightness * (2.0 * r[6] - 1.0),
            "contrast": 1.0 + a.contrast * (2.0 * r[7] - 1.0),
            "saturation": 1.0 + a.saturation * (2.0 * r[8] - 1.0),
            "hue": a.hue * (2.0 * r[9] - 1.0)}


def _affine_args(p: dict, h: int, w: int) -> dict:
    # Zooming by 1/sqrt(s) about the crop centre maps the crop onto the full image: the translation moves the
    # crop centre to the image centre (scaled by the zoom; the ±5° rotation of that shift is ignored).
    zoom = 1.0 / math.sqrt(p["area"])
    return {"angle": p["angle"], "translate": [-p["cx"] * w * zoom, -p["cy"] * h * zoom], "scale": zoom,
            "shear": [0.0, 0.0]}


class Augment:
    """Per-sample augmentation of a uint8 CHW image (torchvision v2 functional ops): ``aug(img, seed)``."""

    def __init__(self, aug: AugmentSettings | dict | None):
        self.a = settings_of(aug)

    def __call__(self, img: torch.Tensor, seed: int) -> torch.Tensor:
        p = draw_params(self.a, seed)
        h, w = img.shape[-2:]
        img = TF.affine(img, **_affine_args(p, h, w), interpolation=InterpolationMode.BILINEAR)
        if p["hflip"]:
            img = TF.horizontal_flip(img)
        if p["vflip"]:
            img = TF.vertical_flip(img)
        ops = {0: (TF.adjust_brightness, "brightness"), 1: (TF.adjust_contrast, "contrast"),
               2: (TF.adjust_saturation, "saturation"), 3: (TF.adjust_hue, "hue")}
        for k in p["order"]:
            fn, name = ops[k]
            if getattr(self.a, name):
                img = fn(img, p[name])
        return img

    def __repr__(self) -> str:
        return f"Augment({self.a})"


# -- batched, on the device -------------------------------------------------------------------------------------

def _gray(x: torch.Tensor) -> torch.Tensor:
    return (0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)


def _blend(x: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    return (x * ratio + other * (1.0 - ratio)).clamp_(0.0, 1.0)


def _jitter_op(k: int, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    f4 = f.view(-1, 1, 1, 1)
    if k == 0:
        return (x * f4).clamp_(0.0, 1.0)
    if k == 1:
        return _blend(x, _gray(x).mean(dim=(1, 2, 3), keepdim=True), f4)
    if k == 2:
        return _blend(x, _gray(x), f4)
    hsv = _rgb_to_hsv(x)
    h, s, v = hsv.unbind(dim=1)
    h = (h + f.view(-1, 1, 1)).remainder(1.0)
    return _hsv_to_rgb(torch.stack((h, s, v), dim=1))


def augment_batch(x: torch.Tensor, seeds: Sequence[int], aug: AugmentSettings | dict | None) -> torch.Tensor:
    """The :class:`Augment` operations on a float batch in [0, 1] (``[B, 3, H, W]``, any device)."""
    a = settings_of(aug)
    params = [draw_params(a, int(s)) for s in seeds]
    b, _, h, w = x.shape
    dev, dt = x.device, x.dtype
    # Affine: per-sample inverse matrices in torchvision's convention (pixel units about the image centre),
    # sampled on the same grid as v2.functional.affine.
    theta = torch.tensor([_get_inverse_affine_matrix([0.0, 0.0], **_affine_args(p, h, w)) for p in params],
                         dtype=dt, device=dev).view(b, 2, 3)
    base = torch.ones(1, h, w, 3, dtype=dt, device=dev)
    base[..., 0] = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev, dtype=dt)
    base[..., 1] = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev, dtype=dt).unsqueeze(-1)
    scaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=dt, device=dev)
    grid = (base.view(1, h * w, 3) @ scaled).view(b, h, w, 2)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    hf = torch.tensor([p["hflip"] for p in params], device=dev).view(b, 1, 1, 1)
    vf = torch.tensor([p["vflip"] for p in params], device=dev).view(b, 1, 1, 1)
    x = torch.where(hf, x.flip(-1), x)
    x = torch.where(vf, x.flip(-2), x)
    factors = torch.tensor([[p[n] for n in JITTER] for p in params], dtype=dt, device=dev)  # [B, 4]
    order = torch.tensor([p["order"] for p in params])  # [B, 4], on the CPU: no device sync to find the rows
    for pos in range(4):
        for k, name in enumerate(JITTER):
            rows = (order[:, pos] == k).nonzero().flatten()
            if getattr(a, name) and len(rows):
                idx = rows.to(dev)
                x[idx] = _jitter_op(k, x[idx], factors[idx, k])
    return x


def build_train_transform(aug: AugmentSettings | dict | None) -> Augment | None:
    """The per-sample (loader-side) augmentation, or None when ``enabled`` is false."""
    a = settings_of(aug)
    return Augment(a) if a.enabled else None
