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
    # The tight bounding box is computed once for both files (savefig's "tight" would lay the figure out twice).
    from matplotlib.layout_engine import PlaceHolderLayoutEngine
    engine = fig.get_layout_engine()
    if engine is not None and not isinstance(engine, PlaceHolderLayoutEngine):
        fig.draw_without_rendering()  # runs the layout engine (constrained layout), so the bbox is the final one
    # Freeze the layout: with an engine set (even tight_layout's placeholder), savefig draws the figure once more
    # before each file; positions are final here, so the PNG and the PDF each need exactly one draw.
    fig.set_layout_engine(None)
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    fig.savefig(png, dpi=150, bbox_inches=bbox, metadata={"Software": None}, pil_kwargs={"compress_level": 1})
    fig.savefig(pdf, bbox_inches=bbox, metadata={"Creator": None, "Producer": None, "CreationDate": None})
    return [str(png), str(pdf)]


# --- helpers shared by the analysis figures ----------------------------------------------------------------------

matplotlib.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
                            "xtick.labelsize": 8, "ytick.labelsize": 8, "svg.hashsalt": "retinabench",
                            "pdf.compression": 6})

LIKELIHOOD_COLORS = {"known": "#C44E52", "possible": "#DD8452", "unlikely": "#4C72B0"}
# Model-size classes (encoder registry `size_class`), light to dark: the learning-rate figures colour by size.
SIZE_COLORS = {"tiny": "#C7E9B4", "small": "#7FCDBB", "base": "#41B6C4", "large": "#2C7FB8", "huge": "#253494"}


def size_color(size_class: str | None) -> str:
    return SIZE_COLORS.get(size_class or "", "#8C8C8C")


def group_color(group_by: str, value: str | None) -> str:
    """Colour of an encoder group: pretraining domain or model-size class (others: grey)."""
    if group_by == "domain":
        return domain_color(value)
    if group_by == "size_class":
        return size_color(value)
    return "#8C8C8C"


def encoder_domain(encoders: dict[str, dict], name: str) -> str | None:
    return (encoders.get(name) or {}).get("domain")


def encoder_colors(encoders: dict[str, dict], names) -> list[str]:
    """Colour of each encoder: its pretraining domain's."""
    return [domain_color(encoder_domain(encoders, n)) for n in names]


def color_ticklabels(ticklabels, encoders: dict[str, dict]) -> None:
    """Colour encoder tick labels by pretraining domain (labels' text must be encoder names)."""
    for t in ticklabels:
        t.set_color(domain_color(encoder_domain(encoders, t.get_text())))


def domain_handles(encoders: dict[str, dict], names):
    """Legend handles for the pretraining domains of ``names``, in DOMAIN_COLORS order."""
    from matplotlib.patches import Patch
    present = {encoder_domain(encoders, n) or "none" for n in names}
    order = [d for d in DOMAIN_COLORS if d in present] + sorted(present - set(DOMAIN_COLORS))
    return [Patch(facecolor=domain_color(d), label=d) for d in order]


def domain_legend(target, encoders: dict[str, dict], names, **kwargs):
    """Add a 'pretraining domain' legend to a figure or axes."""
    handles = domain_handles(encoders, names)
    kwargs = {"title": "pretraining domain", "frameon": False, **kwargs}
    return target.legend(handles=handles, **kwargs)
