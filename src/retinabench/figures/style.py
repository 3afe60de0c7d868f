"""Shared figure style and the publication targets every figure is drawn to.

Targets (one place, used by every figure module and by the tests): figures are drawn at their printed size — a
journal's double column (180 mm wide) or single column (88 mm) — no taller than a page (240 mm), with no text
below 7 pt, so the printed figure needs no scaling. :func:`layout_problems` checks a drawn figure against them
and reports every text (tick label, title, legend entry, annotation) that leaves the canvas; :func:`save` runs
it before writing, and prints what it finds to the job's log. Figures that would exceed a page are split into one
file per panel group (:func:`page_slices`) instead of one giant sheet. Colours: one per pretraining domain.
"""
from __future__ import annotations

import sys
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")  # figures are files; no display on cluster nodes or CI

MM_PER_INCH = 25.4
PT_PER_INCH = 72.0
WIDTH_MM = {"double": 180.0, "single": 88.0}   # journal column widths (Nature, Lancet, IEEE TMI are 174-183 mm)
MAX_HEIGHT_MM = 240.0                            # printable page height
MIN_FONT_PT = 7.0                                # smallest text after printing at WIDTH_MM
PNG_DPI = 200                                    # the PNG (report, slides); the PDF beside it is vector
FONT = {"base": 7.0, "title": 8.0, "suptitle": 8.5}

DOMAIN_COLORS = {
    "natural": "#4C72B0", "pathology": "#C44E52", "radiology": "#8172B3", "cfp": "#DD8452",
    "oct": "#55A868", "cfp+oct": "#937860", "none": "#8C8C8C",
}
# The paper's pretraining-domain groups (retinabench.stats.groups.DOMAIN_GROUPS): the bars of the distance figures.
DOMAIN_GROUP_COLORS = {"natural": "#4C72B0", "retinal": "#DD8452", "pathology": "#C44E52", "other": "#8C8C8C"}
BASELINE_STYLE: dict[str, dict[str, Any]] = {"majority": dict(color="#7F7F7F", ls="--", lw=0.9),
                                             "chance": dict(color="#B0B0B0", ls=":", lw=0.9)}

matplotlib.rcParams.update({
    "font.size": FONT["base"], "axes.titlesize": FONT["title"], "axes.labelsize": FONT["base"],
    "legend.fontsize": FONT["base"], "legend.title_fontsize": FONT["base"], "xtick.labelsize": FONT["base"],
    "ytick.labelsize": FONT["base"], "figure.titlesize": FONT["suptitle"], "axes.linewidth": 0.6,
    "xtick.major.width": 0.6, "ytick.major.width": 0.6, "lines.linewidth": 1.0, "svg.hashsalt": "retinabench",
    "pdf.compression": 6, "pdf.fonttype": 42,  # TrueType in the PDF: text stays editable in journals' tools
    "figure.constrained_layout.h_pad": 0.03, "figure.constrained_layout.w_pad": 0.03,
})


def mm(value_mm: float) -> float:
    """Millimetres to inches (matplotlib's unit)."""
    return value_mm / MM_PER_INCH


def figsize(height_mm: float, width: str | float = "double") -> tuple[float, float]:
    """(width, height) in inches for a figure ``width`` (``double`` / ``single`` or mm) wide, ``height_mm`` tall
    (capped at the page height: content that needs more is split into files by the caller)."""
    w = WIDTH_MM[width] if isinstance(width, str) else float(width)
    return mm(min(w, WIDTH_MM["double"])), mm(min(max(height_mm, 20.0), MAX_HEIGHT_MM))


def wrap(text: str, width_mm: float, fontsize: float = FONT["base"]) -> str:
    """Wrap ``text`` (keeping its own line breaks) so that each line fits ``width_mm`` at ``fontsize`` pt
    (DejaVu Sans: on average ~0.56 em per character)."""
    chars = max(12, int(width_mm / (fontsize * MM_PER_INCH / PT_PER_INCH * 0.58)))
    return "\n".join(textwrap.fill(line, chars, break_long_words=False, break_on_hyphens=False) or line
                     for line in str(text).split("\n"))


def suptitle(fig, text: str, **kwargs):
    """A figure title wrapped to the figure's width."""
    size = kwargs.pop("fontsize", FONT["suptitle"])
    width = fig.get_figwidth() * MM_PER_INCH - 4
    return fig.suptitle(wrap(text, width, size), fontsize=size, **kwargs)


def page_slices(n_items: int, per_page: int) -> list[slice]:
    """Split ``n_items`` rows (panels, encoders) into pages of at most ``per_page``, balanced in size."""
    if n_items <= 0:
        return []
    n_pages = -(-n_items // max(1, per_page))
    size = -(-n_items // n_pages)
    return [slice(i, min(i + size, n_items)) for i in range(0, n_items, size)]


def domain_color(domain: str | None) -> str:
    return DOMAIN_COLORS.get(domain or "none", "#8C8C8C")


# --- checks -----------------------------------------------------------------------------------------------------

def _drawn_texts(fig, tick_groups: list | None = None):
    """Every Text artist the figure draws: visible, non-empty, with visible ancestors; only the tick labels of
    ticks inside the view interval (the others exist as objects but are not drawn). ``tick_groups`` collects the
    drawn tick labels of each axis (for the overlap check)."""
    from matplotlib.axis import Axis
    from matplotlib.text import Text
    out = []

    def walk(artist):
        if not artist.get_visible():
            return
        if isinstance(artist, Text):
            if artist.get_text().strip():
                out.append(artist)
        if isinstance(artist, Axis):
            lo, hi = sorted(artist.get_view_interval())
            tol = 1e-9 * max(1.0, abs(hi - lo))
            ticks = [t for t in [*artist.get_major_ticks(), *artist.get_minor_ticks()]
                     if t.get_loc() is not None and lo - tol <= artist.convert_units(t.get_loc()) <= hi + tol]
            children = [artist.label, artist.offsetText, *ticks]
            if tick_groups is not None:
                for attr in ("label1", "label2"):
                    labels = [getattr(t, attr) for t in ticks]
                    tick_groups.append([t for t in labels if t.get_visible() and t.get_text().strip()])
        else:
            children = artist.get_children()
        for child in children:
            walk(child)

    walk(fig)
    return out


def _overlapping(labels, renderer, tolerance_px: float) -> list[tuple[str, str]]:
    """Pairs of texts whose (rotated) boxes overlap. A rotated label's axis-aligned extent shares its centre with
    the rotated box; the box's own width and height come from the unrotated text."""
    import math
    boxes = []
    for t in labels:
        ext = t.get_window_extent(renderer)
        angle = t.get_rotation()
        t.set_rotation(0)
        flat = t.get_window_extent(renderer)
        t.set_rotation(angle)
        rad = math.radians(angle)
        u, n = (math.cos(rad), math.sin(rad)), (-math.sin(rad), math.cos(rad))
        boxes.append((t.get_text(), (ext.x0 + ext.x1) / 2, (ext.y0 + ext.y1) / 2, flat.width, flat.height, u, n,
                      angle))
    out = []
    for i, (ta, xa, ya, wa, ha, u, n, angle) in enumerate(boxes):
        for tb, xb, yb, wb, hb, _, _, angle_b in boxes[i + 1:]:
            if abs(angle - angle_b) > 1e-6:
                continue
            dx, dy = xb - xa, yb - ya
            along = abs(dx * u[0] + dy * u[1]) - (wa + wb) / 2
            across = abs(dx * n[0] + dy * n[1]) - (ha + hb) / 2
            if along < -tolerance_px and across < -tolerance_px:
                out.append((ta, tb))
    return out


def _legends_over_data(fig, renderer, tolerance_px: float) -> list[str]:
    """Legends (of the figure or of a panel) whose box covers part of a visible panel's data area."""
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    out = []
    for legend in legends:
        if not legend.get_visible():
            continue
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if not ax.get_visible() or not ax.axison and not ax.has_data():
                continue
            area = ax.bbox
            dx = min(box.x1, area.x1) - max(box.x0, area.x0)
            dy = min(box.y1, area.y1) - max(box.y0, area.y0)
            if dx > tolerance_px and dy > tolerance_px:
                title = legend.get_title().get_text() or ", ".join(t.get_text() for t in legend.get_texts()[:2])
                panel = ax.get_title() or ax.get_ylabel() or f"panel {fig.axes.index(ax) + 1}"
                out.append(f"legend {title[:40]!r} covers the data area of {panel[:40]!r}")
    return out


def layout_problems(fig, *, max_width_mm: float = WIDTH_MM["double"], max_height_mm: float = MAX_HEIGHT_MM,
                    min_font_pt: float = MIN_FONT_PT, tolerance_px: float = 1.0) -> list[str]:
    """What keeps a drawn figure from print quality: a canvas wider or taller than the targets, text below the
    minimum size (after the scaling a too-wide figure would need), text that extends beyond the canvas (a clipped
    label), tick labels of one axis that overprint each other, or a legend over a panel's data area (legends go
    outside the data). Empty list = fine. Uses the renderer's text
    extents, so it sees exactly what is drawn."""
    problems = []
    w_mm, h_mm = fig.get_figwidth() * MM_PER_INCH, fig.get_figheight() * MM_PER_INCH
    if w_mm > max_width_mm + 0.5:
        problems.append(f"canvas {w_mm:.0f} mm wide > {max_width_mm:.0f} mm")
    if h_mm > max_height_mm + 0.5:
        problems.append(f"canvas {h_mm:.0f} mm tall > {max_height_mm:.0f} mm")
    scale = min(1.0, max_width_mm / w_mm)
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    groups: list = []
    texts = _drawn_texts(fig, groups)
    for labels in groups:  # tick labels of one axis must not overprint each other
        problems += [f"tick labels {a!r} and {b!r} overlap" for a, b in _overlapping(labels, renderer, tolerance_px)]
    problems += _legends_over_data(fig, renderer, tolerance_px)
    for t in texts:
        label = t.get_text().replace("\n", " ")
        label = label if len(label) <= 40 else label[:37] + "..."
        size = t.get_fontsize() * scale
        if size < min_font_pt - 1e-6:
            problems.append(f"text {label!r}: {size:.1f} pt < {min_font_pt:g} pt")
        ext = t.get_window_extent(renderer)
        over = {"left": canvas.x0 - ext.x0, "right": ext.x1 - canvas.x1, "bottom": canvas.y0 - ext.y0,
                "top": ext.y1 - canvas.y1}
        out = {k: v for k, v in over.items() if v > tolerance_px}
        if out:
            where = ", ".join(f"{k} by {v * MM_PER_INCH / fig.dpi:.1f} mm" for k, v in out.items())
            problems.append(f"text {label!r} extends beyond the canvas ({where})")
    return problems


_RECORDERS: list[list[dict]] = []


class recording:
    """``with recording() as saved:`` — every figure :func:`save` writes meanwhile is appended to ``saved`` as
    ``{"path", "width_mm", "height_mm", "width_px", "height_px", "problems"}`` (tests check figures this way)."""

    def __enter__(self) -> list[dict]:
        self.saved: list[dict] = []
        _RECORDERS.append(self.saved)
        return self.saved

    def __exit__(self, *exc) -> None:
        _RECORDERS.remove(self.saved)


def save(fig, png_path, *, check: bool = True) -> list[str]:
    """Write the PNG (PNG_DPI) and a vector PDF beside it, at exactly the figure's size (no tight cropping: the
    layout engine fits everything inside the target canvas). Fixed metadata, so reruns give identical bytes where
    the backend allows. Layout problems (:func:`layout_problems`) are printed to stderr (the job's log)."""
    from pathlib import Path

    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    from retinabench.atomic import atomic_write
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    pdf = png.with_suffix(".pdf")
    fig.set_dpi(PNG_DPI)
    engine = fig.get_layout_engine()
    if engine is not None and not isinstance(engine, PlaceHolderLayoutEngine):
        fig.draw_without_rendering()  # runs the layout engine (constrained layout): positions are now final
    # Freeze the layout: with an engine set, savefig would solve it again before each file.
    fig.set_layout_engine(None)
    problems = []
    if check or _RECORDERS:
        fig.draw_without_rendering()
        problems = layout_problems(fig)
        for problem in problems:
            print(f"figure {png.name}: {problem}", file=sys.stderr)
    w, h = fig.get_size_inches()
    for saved in _RECORDERS:
        saved.append({"path": str(png), "width_mm": w * MM_PER_INCH, "height_mm": h * MM_PER_INCH,
                      "width_px": int(round(w * PNG_DPI)), "height_px": int(round(h * PNG_DPI)),
                      "problems": problems})
    # Each file atomically (a temporary name beside it, renamed): a killed job leaves no half-written figure.
    atomic_write(png, lambda tmp: fig.savefig(tmp, format="png", dpi=PNG_DPI, metadata={"Software": None},
                                              pil_kwargs={"compress_level": 1}))
    atomic_write(pdf, lambda tmp: fig.savefig(tmp, format="pdf",
                                              metadata={"Creator": None, "Producer": None, "CreationDate": None}))
    return [str(png), str(pdf)]


# --- helpers shared by the analysis figures ----------------------------------------------------------------------

# Exposure likelihood (stats.leakage.LIKELIHOODS), most to least likely: red, orange, yellow, blue.
LIKELIHOOD_COLORS = {"known": "#C44E52", "likely": "#DD8452", "possible": "#E6C229", "unlikely": "#4C72B0"}
# Model-size classes (encoder registry `size_class`), light to dark: the learning-rate figures colour by size.
SIZE_COLORS = {"tiny": "#C7E9B4", "small": "#7FCDBB", "base": "#41B6C4", "large": "#2C7FB8", "huge": "#253494",
               "giant": "#081D58"}


def size_color(size_class: str | None) -> str:
    return SIZE_COLORS.get(size_class or "", "#8C8C8C")


def group_color(group_by: str, value: str | None) -> str:
    """Colour of an encoder group: pretraining domain, domain group or model-size class (others: grey)."""
    if group_by == "domain":
        return domain_color(value)
    if group_by == "domain_group":
        return DOMAIN_GROUP_COLORS.get(value or "", "#8C8C8C")
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
    """Add a 'pretraining domain' legend to a figure or axes (on a figure: below the panels, outside the data)."""
    handles = domain_handles(encoders, names)
    if hasattr(target, "add_subplot") and "loc" not in kwargs:  # a figure: rows under the panels
        kwargs["loc"] = "outside lower center"
        width_mm = target.get_figwidth() * MM_PER_INCH
        longest = max([len(h.get_label()) for h in handles] + [4])
        kwargs.setdefault("ncol", max(1, min(len(handles), int((width_mm - 10) // (1.6 * longest + 8)))))
    kwargs = {"title": "pretraining domain", "frameon": False, **kwargs}
    return target.legend(handles=handles, **kwargs)


def baseline_lines(ax, majority: float | None, chance: float | None, *, orientation: str = "h",
                   scale: float = 1.0) -> list:
    """Reference lines of a metric axis: the majority-class rate (dashed) and chance (dotted); returns legend
    handles for the lines drawn."""
    from matplotlib.lines import Line2D
    handles = []
    for name, value in (("majority", majority), ("chance", chance)):
        if value is None or value != value:
            continue
        line = (ax.axhline if orientation == "h" else ax.axvline)(value * scale, zorder=0.5, **BASELINE_STYLE[name])
        handles.append(Line2D([], [], **BASELINE_STYLE[name], label="majority class" if name == "majority"
                              else "chance"))
        del line
    return handles
