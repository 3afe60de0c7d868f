"""Attribution -> grayscale -> CLAHE -> heatmap, the display pipeline of the saliency figures.

* Grayscale: the attribution's channels are summed, then ``absolute_value`` (|sum|) or ``positive`` (sum clipped at
  0) — Captum's ``visualize_image_attr`` conventions for an image attribution.
* Scaled to [0, 1] by the ``clip_percentile``-th percentile (values above it saturate), so one extreme pixel does
  not flatten the map.
* CLAHE: scikit-image's ``equalize_adapthist`` (contrast-limited adaptive histogram equalisation; ``kernel_size``
  None = 1/8 of the image side, ``clip_limit`` 0.01, 256 bins — its defaults). A constant map (e.g. a model whose
  output ignores the input) stays all zero instead of CLAHE's degenerate all-one output.
* Heatmap: a matplotlib colormap applied to the CLAHE map (uint8 RGB).
"""
from __future__ import annotations

import numpy as np

from retinabench.settings.layers import SALIENCY_SIGNS as SIGNS
from retinabench.settings.layers import SaliencySettings




def to_grayscale(attribution: np.ndarray, sign: str = "absolute_value") -> np.ndarray:
    """[3, H, W] (or [H, W, 3]) attribution -> non-negative [H, W] float32 map."""
    a = np.asarray(attribution, dtype=np.float64)
    if a.ndim != 3 or 3 not in (a.shape[0], a.shape[-1]):
        raise ValueError(f"expected a [3, H, W] or [H, W, 3] attribution, got shape {a.shape}")
    summed = a.sum(axis=0) if a.shape[0] == 3 else a.sum(axis=-1)
    if sign == "absolute_value":
        gray = np.abs(summed)
    elif sign == "positive":
        gray = np.clip(summed, 0.0, None)
    else:
        raise ValueError(f"saliency.sign must be one of {SIGNS}, got {sign!r}")
    return gray.astype(np.float32)


def scale_unit(gray: np.ndarray, clip_percentile: float = 99.0) -> np.ndarray:
    """Non-negative map -> [0, 1] by its ``clip_percentile``-th percentile (an all-zero map stays zero)."""
    g = np.asarray(gray, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"expected a 2-D map, got shape {g.shape}")
    if (g < 0).any() or not np.isfinite(g).all():
        raise ValueError("scale_unit expects a finite non-negative map (use to_grayscale first)")
    if not 0 < clip_percentile <= 100:
        raise ValueError(f"clip_percentile must be in (0, 100], got {clip_percentile}")
    top = float(np.percentile(g, clip_percentile))
    if top <= 0:
        top = float(g.max())
    if top <= 0:
        return np.zeros_like(g, dtype=np.float32)
    return np.clip(g / top, 0.0, 1.0).astype(np.float32)


def clahe(map01: np.ndarray, *, clip_limit: float = 0.01, kernel_size: int | None = None,
          nbins: int = 256) -> np.ndarray:
    """Contrast-limited adaptive histogram equalisation of a [0, 1] map (scikit-image); float32 in [0, 1], same
    shape."""
    from skimage.exposure import equalize_adapthist
    m = np.asarray(map01, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"CLAHE expects a 2-D map, got shape {m.shape}")
    if not np.isfinite(m).all() or m.min() < 0 or m.max() > 1:
        raise ValueError(f"CLAHE expects values in [0, 1], got [{np.nanmin(m)}, {np.nanmax(m)}]")
    if m.max() == m.min():
        return np.zeros_like(m, dtype=np.float32)
    out = equalize_adapthist(m, kernel_size=kernel_size, clip_limit=clip_limit, nbins=nbins)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def heatmap(map01: np.ndarray, cmap: str = "inferno") -> np.ndarray:
    """[H, W] map in [0, 1] -> uint8 [H, W, 3] through a matplotlib colormap."""
    import matplotlib
    rgba = matplotlib.colormaps[cmap](np.clip(np.asarray(map01, dtype=np.float64), 0.0, 1.0))
    return (rgba[..., :3] * 255.0 + 0.5).astype(np.uint8)


def postprocess(attribution: np.ndarray, settings: SaliencySettings) -> tuple[np.ndarray, np.ndarray]:
    """(scaled grayscale map, CLAHE map) of one attribution under the ``saliency:`` settings."""
    gray = scale_unit(to_grayscale(attribution, settings.sign), settings.clip_percentile)
    c = settings.clahe
    return gray, clahe(gray, clip_limit=c.clip_limit, kernel_size=c.kernel_size, nbins=c.nbins)
