"""Shared figure style: one colour per pretraining domain, used by every figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # figures are files; no display on cluster nodes or CI

DOMAIN_COLORS = {
    "natural": "#4C72B0", "pathology": "#C44E52", "radiology": "#8172B3", "cfp": "#DD8452",
    "oct": "#55A868", "cfp+oct": "#937860", "none": "#8C8C8C",
}


def domain_color(domain: str | None) -> str:
    return DOMAIN_COLORS.get(domain or "none", "#8C8C8C")


def save(fig, png_path) -> list[str]:
    """Write PNG (and a PDF beside it); fixed metadata so reruns give identical bytes where the backend allows."""
    from pathlib import Path
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    pdf = png.with_suffix(".pdf")
    fig.savefig(png, dpi=150, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(pdf, bbox_inches="tight", metadata={"Creator": None, "Producer": None, "CreationDate": None})
    return [str(png), str(pdf)]
