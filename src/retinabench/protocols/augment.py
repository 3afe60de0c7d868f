"""Training augmentations of the fine-tuning protocols, seeded per sample.

The paper's list: random resized crop with scale 0.8–1.2, rotation ±5°, horizontal and vertical flips, colour
jitter (brightness/contrast 0.2, saturation/hue 0.1). Two crops (``finetune.augment.crop``):

* ``zoom`` (config/config.yaml): torchvision's ``RandomResizedCrop`` cannot take a crop *larger* than the image,
  so the crop is implemented as what it means geometrically: a crop covering a fraction ``s ~ U(scale)`` of the
  image area, resized back to the full size, is a zoom by ``1/sqrt(s)`` about the crop centre (``s > 1`` zooms
  out; the border is black, the background of fundus and OCT images anyway). The crop centre is uniform over the
  positions where a crop of area ``min(s, 1)`` fits; the aspect ratio is kept. With ``order: geometry_first``
  zoom, shift and rotation are one affine warp (a single bilinear interpolation).
* ``random_resized_crop`` (config/ocularbench.yaml): what the OcularBench authors' code runs (cm090999/dinoret,
  ``util/datasets.py: build_transform``): torchvision ``RandomResizedCrop(size, scale=[0.8, 1.2])``, whose
  sampling (:meth:`v2.RandomResizedCrop.get_params`, called here) draws an area fraction in ``scale`` and a
  log-uniform aspect ratio in ``ratio``, retries until the crop fits inside the image and falls back to a centre
  crop after 10 tries; the crop is resized back bilinearly (antialiased), as the transform's defaults.

``order`` (``finetune.augment.order``): ``geometry_first`` — crop and rotation, flips, sharpness, colour jitter in
a random order per sample (as ``v2.ColorJitter``); ``crop_last`` — the authors' order: flips, rotation
(``RandomRotation``'s default nearest interpolation, black corners), sharpness (``RandomAdjustSharpness``), colour
jitter (its contrast mean includes the rotated corners), crop last.

Every random number of a sample comes from :func:`draw_params` with that sample's seed, so two paths give the
same augmentation:

* :class:`Augment` — one uint8 CHW image at a time with ``torchvision.transforms.v2.functional`` ops (in the
  DataLoader; the reference, and the CPU default);
* :func:`augment_batch` — the same operations batched on the training device in float (the CUDA default, so
  CPU data-loader workers are not the bottleneck of a GPU step). It equals the reference up to interpolation and
  uint8 rounding (tests pin the tolerance). torchvision's public ops take one set of parameters per call, so the
  per-sample parts are written here with torch on public API only: the inverse affine matrices
  (:func:`inverse_affine`, torchvision's convention) sampled on ``v2.functional.affine``'s grid, and the hue shift
  (:func:`shift_hue`, equal to ``v2.functional.adjust_hue`` in float); brightness, contrast, saturation and
  sharpness are ``v2.functional``'s blends with a factor per sample. No private torchvision name is imported
  (tests/test_public_api.py).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from retinabench.settings.finetune import AugmentSettings

JITTER = ("brightness", "contrast", "saturation", "hue")
ROTATE_INTERPOLATION = InterpolationMode.NEAREST  # v2.RandomRotation's default (the authors' separate rotation)
CROP_INTERPOLATION = InterpolationMode.BILINEAR  # v2.RandomResizedCrop's default, antialiased


def settings_of(aug: AugmentSettings | dict | None) -> AugmentSettings:
    """The typed augmentation settings (a partial dict gets the defaults; unknown keys fail)."""
    return aug if isinstance(aug, AugmentSettings) else AugmentSettings.of(aug, "finetune.augment")


def draw_params(a: AugmentSettings, seed: int) -> dict:
    """All random numbers of one sample's augmentation, from its own generator (the crop box of
    ``random_resized_crop`` needs the image size: :func:`crop_box` of ``crop_seed``)."""
    g = torch.Generator().manual_seed(int(seed))
    r = torch.rand(10, generator=g, dtype=torch.float64).tolist()
    order = torch.randperm(4, generator=g).tolist()
    # Drawn after the zoom's numbers, so adding them left every earlier draw (and the zoom's results) unchanged.
    sharpen = torch.rand(1, generator=g, dtype=torch.float64).item()
    crop_seed = int(torch.randint(0, 2 ** 62, (1,), generator=g).item())
    lo, hi = float(a.scale[0]), float(a.scale[1])
    s = lo + (hi - lo) * r[0]
    side = math.sqrt(min(s, 1.0))  # crop side / image side; a crop larger than the image is centred
    return {"area": s, "angle": float(a.rotation) * (2.0 * r[1] - 1.0),
            "cx": (1.0 - side) * (r[2] - 0.5), "cy": (1.0 - side) * (r[3] - 0.5),  # crop centre, image fractions
            "hflip": r[4] < a.hflip, "vflip": r[5] < a.vflip, "order": order,
            "brightness": 1.0 + a.brightness * (2.0 * r[6] - 1.0),
            "contrast": 1.0 + a.contrast * (2.0 * r[7] - 1.0),
            "saturation": 1.0 + a.saturation * (2.0 * r[8] - 1.0),
            "hue": a.hue * (2.0 * r[9] - 1.0),
            "sharpen": a.sharpness != 1.0 and sharpen < a.sharpness_p, "crop_seed": crop_seed}


def crop_box(a: AugmentSettings, p: dict, h: int, w: int) -> tuple[int, int, int, int]:
    """``(top, left, height, width)`` of the sample's ``random_resized_crop`` on an ``h`` × ``w`` image:
    torchvision's own sampling (``v2.RandomResizedCrop.get_params``, which reads the global CPU generator), run on
    a fork of that generator seeded with the sample's ``crop_seed`` (the global stream is left as it was)."""
    size = torch.empty(()).expand(3, h, w)  # only its shape is read
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(p["crop_seed"])
        return v2.RandomResizedCrop.get_params(size, list(a.scale), list(a.ratio))


def _affine_args(p: dict, h: int, w: int, *, rotate: bool = True) -> dict:
    # Zooming by 1/sqrt(s) about the crop centre maps the crop onto the full image: the translation moves the
    # crop centre to the image centre (scaled by the zoom; the ±5° rotation of that shift is ignored).
    zoom = 1.0 / math.sqrt(p["area"])
    return {"angle": p["angle"] if rotate else 0.0, "translate": [-p["cx"] * w * zoom, -p["cy"] * h * zoom],
            "scale": zoom, "shear": [0.0, 0.0]}


class Augment:
    """Per-sample augmentation of a uint8 CHW image (torchvision v2 functional ops): ``aug(img, seed)``."""

    def __init__(self, aug: AugmentSettings | dict | None):
        self.a = settings_of(aug)

    def _geometry(self, img: torch.Tensor, p: dict, *, rotate: bool) -> torch.Tensor:
        """The crop (and the rotation, when ``rotate``) resized back to the image's size."""
        h, w = img.shape[-2:]
        if self.a.crop == "zoom":
            return TF.affine(img, **_affine_args(p, h, w, rotate=rotate), interpolation=InterpolationMode.BILINEAR)
        if rotate:
            img = self._rotate(img, p)
        return TF.resized_crop(img, *crop_box(self.a, p, h, w), size=[h, w], interpolation=CROP_INTERPOLATION,
                               antialias=True)

    @staticmethod
    def _rotate(img: torch.Tensor, p: dict) -> torch.Tensor:
        return TF.rotate(img, p["angle"], interpolation=ROTATE_INTERPOLATION)

    def _photometric(self, img: torch.Tensor, p: dict) -> torch.Tensor:
        if p["sharpen"]:
            img = TF.adjust_sharpness(img, self.a.sharpness)
        ops = {0: (TF.adjust_brightness, "brightness"), 1: (TF.adjust_contrast, "contrast"),
               2: (TF.adjust_saturation, "saturation"), 3: (TF.adjust_hue, "hue")}
        for k in p["order"]:
            fn, name = ops[k]
            if getattr(self.a, name):
                img = fn(img, p[name])
        return img

    @staticmethod
    def _flips(img: torch.Tensor, p: dict) -> torch.Tensor:
        if p["hflip"]:
            img = TF.horizontal_flip(img)
        if p["vflip"]:
            img = TF.vertical_flip(img)
        return img

    def __call__(self, img: torch.Tensor, seed: int) -> torch.Tensor:
        p = draw_params(self.a, seed)
        if self.a.order == "geometry_first":
            return self._photometric(self._flips(self._geometry(img, p, rotate=True), p), p)
        img = self._photometric(self._rotate(self._flips(img, p), p), p)
        return self._geometry(img, p, rotate=False)

    def __repr__(self) -> str:
        return f"Augment({self.a})"


# -- batched, on the device -------------------------------------------------------------------------------------

def _gray(x: torch.Tensor) -> torch.Tensor:
    return (0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)


def _blend(x: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    return (x * ratio + other * (1.0 - ratio)).clamp_(0.0, 1.0)


def shift_hue(x: torch.Tensor, hue: torch.Tensor) -> torch.Tensor:
    """``v2.functional.adjust_hue`` of a float RGB batch in [0, 1] with one factor per sample (``hue``: ``[B]``,
    fractions of a turn). A hue shift keeps HSV's value (the largest channel) and saturation (so the smallest
    channel too); the hue, piecewise linear in the channels, moves round the six sectors, and each channel is read
    back from the shifted hue with the closed form ``v - c * clamp(min(k, 4 - k), 0, 1)``, ``k = (n + 6 h) mod 6``
    with ``n`` = 5, 3, 1 for red, green, blue."""
    r, g, b = x.unbind(dim=1)
    m, v = torch.aminmax(x, dim=1)
    c = v - m  # chroma; 0 for a grey pixel, whose hue is irrelevant (its sector offset then multiplies 0)
    h6 = torch.where(v == r, g - b, torch.where(v == g, (b - r).add_(c, alpha=2.0), (r - g).add_(c, alpha=4.0)))
    h6.mul_(c.clamp(min=1e-12).reciprocal_()).add_(6.0 * hue.view(-1, 1, 1).to(x.dtype) + 6.0)  # 6 h + 6 > 0
    n = torch.tensor([5.0, 3.0, 1.0], dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    k = (h6.unsqueeze(1) + n).remainder_(6.0)
    return torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0).mul_(-c.unsqueeze(1)).add_(v.unsqueeze(1)).clamp_(0.0, 1.0)


def _jitter_op(k: int, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    f4 = f.view(-1, 1, 1, 1)
    if k == 0:
        return (x * f4).clamp_(0.0, 1.0)
    if k == 1:
        return _blend(x, _gray(x).mean(dim=(1, 2, 3), keepdim=True), f4)
    if k == 2:
        return _blend(x, _gray(x), f4)
    return shift_hue(x, f)


def inverse_affine(angle: torch.Tensor, translate: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[B, 2, 3]`` inverse matrices of the affine maps that ``v2.functional.affine(img, angle, translate, scale,
    shear=0)`` applies (centre: the image centre, pixel units; ``angle`` in degrees, clockwise on the image as
    torchvision's): the output pixel ``p`` samples the input at ``R(angle)^-1 (p - t) / scale``. ``angle``,
    ``scale``: ``[B]``; ``translate``: ``[B, 2]``."""
    rad = torch.deg2rad(angle)
    cos, sin = torch.cos(rad) / scale, torch.sin(rad) / scale
    lin = torch.stack((torch.stack((cos, sin), dim=-1), torch.stack((-sin, cos), dim=-1)), dim=-2)  # [B, 2, 2]
    return torch.cat((lin, -(lin @ translate.unsqueeze(-1))), dim=-1)


def _warp(x: torch.Tensor, inverse: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-sample inverse affine matrices (:func:`inverse_affine`, pixel units about the image centre) sampled on
    the same grid as v2.functional.affine / rotate."""
    b, _, h, w = x.shape
    dev, dt = x.device, x.dtype
    theta = inverse.to(device=dev, dtype=dt).view(b, 2, 3)
    base = torch.ones(1, h, w, 3, dtype=dt, device=dev)
    base[..., 0] = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev, dtype=dt)
    base[..., 1] = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev, dtype=dt).unsqueeze(-1)
    scaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=dt, device=dev)
    grid = (base.view(1, h * w, 3) @ scaled).view(b, h, w, 2)
    return F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)


def _crop_axis(start: torch.Tensor, length: torch.Tensor, n: int, dt: torch.dtype) -> torch.Tensor:
    """Normalised grid coordinates ``[B, n]`` of a crop ``[start, start + length)`` resized to ``n`` pixels: the
    source positions of bilinear resizing (half-pixel centres, clamped to the crop's first and last pixel)."""
    src = (torch.arange(n, device=start.device, dtype=dt) + 0.5) * (length / n).unsqueeze(1) - 0.5
    src = torch.minimum(src.clamp(min=0.0), (length - 1).unsqueeze(1)) + start.unsqueeze(1)
    return (src + 0.5) * (2.0 / n) - 1.0


def _resized_crops(x: torch.Tensor, boxes: list[tuple[int, int, int, int]]) -> torch.Tensor:
    """Each sample's ``(top, left, height, width)`` crop resized back to the batch's size (bilinear; a crop never
    exceeds the image, so this only upsamples, where antialiasing changes nothing)."""
    b, _, h, w = x.shape
    t = torch.tensor(boxes, dtype=x.dtype).to(x.device)  # [B, 4]
    gy, gx = _crop_axis(t[:, 0], t[:, 2], h, x.dtype), _crop_axis(t[:, 1], t[:, 3], w, x.dtype)
    grid = torch.stack((gx.unsqueeze(1).expand(b, h, w), gy.unsqueeze(2).expand(b, h, w)), dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _batch_geometry(x: torch.Tensor, a: AugmentSettings, params: list[dict], *, rotate: bool) -> torch.Tensor:
    h, w = x.shape[-2:]
    if a.crop == "zoom":
        args = [_affine_args(p, h, w, rotate=rotate) for p in params]
        inv = inverse_affine(torch.tensor([g["angle"] for g in args], dtype=torch.float64),
                             torch.tensor([g["translate"] for g in args], dtype=torch.float64),
                             torch.tensor([g["scale"] for g in args], dtype=torch.float64))
        return _warp(x, inv, "bilinear")
    if rotate:
        x = _batch_rotate(x, params)
    return _resized_crops(x, [crop_box(a, p, h, w) for p in params])


def _batch_rotate(x: torch.Tensor, params: list[dict]) -> torch.Tensor:
    # v2.functional.rotate(angle) is an affine rotation by -angle (counter-clockwise) about the centre
    b = len(params)
    inv = inverse_affine(-torch.tensor([p["angle"] for p in params], dtype=torch.float64),
                         torch.zeros(b, 2, dtype=torch.float64), torch.ones(b, dtype=torch.float64))
    return _warp(x, inv, ROTATE_INTERPOLATION.value)


def _batch_flips(x: torch.Tensor, params: list[dict]) -> torch.Tensor:
    for key, dim in (("hflip", -1), ("vflip", -2)):
        rows = [i for i, p in enumerate(params) if p[key]]
        if rows:
            idx = torch.tensor(rows, device=x.device)
            x = x.index_copy(0, idx, x.index_select(0, idx).flip(dim))
    return x


def _batch_photometric(x: torch.Tensor, a: AugmentSettings, params: list[dict]) -> torch.Tensor:
    dev, dt = x.device, x.dtype
    sharpen = [i for i, p in enumerate(params) if p["sharpen"]]
    if sharpen:
        idx = torch.tensor(sharpen, device=dev)
        x[idx] = TF.adjust_sharpness(x[idx], a.sharpness)
    factors = torch.tensor([[p[n] for n in JITTER] for p in params], dtype=dt, device=dev)  # [B, 4]
    order = torch.tensor([p["order"] for p in params])  # [B, 4], on the CPU: no device sync to find the rows
    for pos in range(4):
        for k, name in enumerate(JITTER):
            rows = (order[:, pos] == k).nonzero().flatten()
            if getattr(a, name) and len(rows):
                idx = rows.to(dev)
                x[idx] = _jitter_op(k, x[idx], factors[idx, k])
    return x


def augment_batch(x: torch.Tensor, seeds: Sequence[int], aug: AugmentSettings | dict | None) -> torch.Tensor:
    """The :class:`Augment` operations on a float batch in [0, 1] (``[B, 3, H, W]``, any device)."""
    a = settings_of(aug)
    params = [draw_params(a, int(s)) for s in seeds]
    if a.order == "geometry_first":
        x = _batch_flips(_batch_geometry(x, a, params, rotate=True), params)
        return _batch_photometric(x, a, params)
    x = _batch_photometric(_batch_rotate(_batch_flips(x, params), params), a, params)
    return _batch_geometry(x, a, params, rotate=False)


def build_train_transform(aug: AugmentSettings | dict | None) -> Augment | None:
    """The per-sample (loader-side) augmentation, or None when ``enabled`` is false."""
    a = settings_of(aug)
    return Augment(a) if a.enabled else None
