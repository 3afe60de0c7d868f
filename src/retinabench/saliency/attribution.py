"""Integrated gradients inside Captum's NoiseTunnel, on the normalised image at the image cache's resolution.

The attribution is taken with respect to the input the pipeline feeds the model: the uint8 cache image (224 × 224
by default) scaled to [0, 1] and normalised with the encoder's mean/std. When the encoder's input size differs,
the resize happens inside the attributed function (:class:`CacheInput`), so attributions always live on the
pixel grid of the image shown beside them. Noise (``stdev``) is added by NoiseTunnel in that normalised space, and
the noise draws are seeded, so on CPU a map is reproducible bit for bit. Attribution always runs in fp32 (no
autocast, also on CUDA): integrated gradients sums many small gradients, which bf16 would round away.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from retinabench.settings.layers import SALIENCY_BASELINES as BASELINES  # noqa: F401
from retinabench.settings.layers import SALIENCY_NT_TYPES as NT_TYPES  # noqa: F401


class CacheInput(nn.Module):
    """``model`` applied to a normalised image of any size: bicubic resize to ``input_size`` first (the resize and
    the per-channel normalisation commute, so this is exactly the pipeline's ``prepare``)."""

    def __init__(self, model: nn.Module, input_size: int):
        super().__init__()
        self.model, self.input_size = model, int(input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_size or x.shape[-2] != self.input_size:
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bicubic", align_corners=False)
        return self.model(x)


def normalise(image_u8: np.ndarray, mean, std, device: torch.device) -> torch.Tensor:
    """uint8 HWC -> float [1, 3, H, W] normalised (the math of features.to_model_input, without the resize)."""
    if image_u8.ndim != 3 or image_u8.shape[-1] != 3 or image_u8.dtype != np.uint8:
        raise ValueError(f"expected a uint8 [H, W, 3] image, got {image_u8.dtype} {image_u8.shape}")
    x = torch.from_numpy(np.array(image_u8, copy=True)).to(device).permute(2, 0, 1)[None].float().div_(255.0)
    m = torch.tensor(mean, device=device, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, device=device, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - m) / s


def baseline_tensor(kind: str, x: torch.Tensor, mean, std) -> torch.Tensor:
    """IG baseline in normalised space: ``zeros`` (Captum's default: the normalisation mean colour) or ``black``
    (pixel value 0)."""
    if kind == "zeros":
        return torch.zeros_like(x)
    if kind == "black":
        m = torch.tensor(mean, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        s = torch.tensor(std, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        return ((0.0 - m) / s).expand_as(x).contiguous()
    raise ValueError(f"saliency.baseline must be one of {BASELINES}, got {kind!r}")


def predict(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """Class probabilities (float64) of a [1, 3, H, W] input."""
    with torch.no_grad():
        return torch.softmax(model(x).double(), dim=1)[0].cpu().numpy()


def integrated_gradients_nt(model: nn.Module, x: torch.Tensor, target: int, *, nt_samples: int, stdev: float,
                            n_steps: int, nt_type: str = "smoothgrad", nt_samples_batch_size: int | None = 1,
                            internal_batch_size: int | None = None, baseline: torch.Tensor | None = None,
                            seed: int = 0) -> tuple[np.ndarray, float]:
    """Attribution ``[3, H, W]`` (float32) of ``model``'s logit ``target`` for one input ``x`` [1, 3, H, W], and
    the mean absolute completeness error of IG over the noisy copies (|sum of attributions - (f(x) -
    f(baseline))|, Captum's convergence delta; large values say ``n_steps`` is too small).

    ``NoiseTunnel(IntegratedGradients(model))``: ``nt_samples`` noisy copies ``x + N(0, stdev²)``, integrated
    gradients of each from ``baseline`` along ``n_steps`` (Gauss–Legendre) points, combined by ``nt_type``.
    ``nt_samples_batch_size`` noisy copies go through IG together and IG evaluates ``internal_batch_size``
    points per forward pass (memory bounds only; the result does not depend on them beyond float rounding).
    """
    from captum.attr import IntegratedGradients, NoiseTunnel
    if nt_type not in NT_TYPES:
        raise ValueError(f"saliency.nt_type must be one of {NT_TYPES}, got {nt_type!r}")
    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"expected one input [1, 3, H, W], got {tuple(x.shape)}")
    was_training = model.training
    model.eval()
    grads = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)  # gradients w.r.t. the input only: no parameter graph to keep
    try:
        torch.manual_seed(seed)  # NoiseTunnel draws its noise from the global generator (CUDA too)
        nt = NoiseTunnel(IntegratedGradients(model))
        attr, delta = nt.attribute(x, nt_type=nt_type, nt_samples=int(nt_samples), stdevs=float(stdev),
                                   nt_samples_batch_size=nt_samples_batch_size, target=int(target),
                                   baselines=baseline if baseline is not None else torch.zeros_like(x),
                                   n_steps=int(n_steps), internal_batch_size=internal_batch_size,
                                   return_convergence_delta=True)
    finally:
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)
        model.train(was_training)
    out = attr.detach()[0].float().cpu().numpy()
    if not np.isfinite(out).all():
        raise FloatingPointError("integrated gradients produced non-finite attributions")
    return out, float(delta.detach().abs().float().mean())
