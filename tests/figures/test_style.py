"""The publication targets and the layout check every figure is held to (figures/style.py)."""
import matplotlib.pyplot as plt
import pytest

from retinabench.figures import style
from retinabench.figures.style import MAX_HEIGHT_MM, WIDTH_MM, figsize, layout_problems, page_slices, save, wrap


def drawn(fig):
    fig.draw_without_rendering()
    return layout_problems(fig)


def test_a_figure_within_the_targets_has_no_problems():
    fig, ax = plt.subplots(figsize=figsize(80), layout="constrained")
    ax.plot([0, 1], [0, 1])
    ax.set_xticks([0, 0.5, 1], ["zero", "half", "one"])
    ax.set_xlabel("x")
    style.suptitle(fig, "A long title " * 20)  # wrapped to the width
    assert drawn(fig) == []
    plt.close(fig)


def test_clipped_small_overlapping_and_oversized_text_is_reported():
    fig, ax = plt.subplots(figsize=figsize(60))
    fig.subplots_adjust(left=0.0)  # no room for the y tick labels: they leave the canvas
    ax.set_yticks([0, 1], ["a very long encoder name", "another encoder"])
    ax.set_xticks([0, 0.01], ["overprinted label", "second label"])
    ax.text(0.5, 0.5, "tiny", fontsize=5)
    problems = drawn(fig)
    assert any("extends beyond the canvas (left" in p and "a very long encoder" in p for p in problems), problems
    assert any("'tiny': 5.0 pt < 7 pt" in p for p in problems), problems
    assert any("overlap" in p and "overprinted label" in p for p in problems), problems
    plt.close(fig)
    wide = plt.figure(figsize=(12, 3))  # 305 mm: text would print at 7 * 180/305 = 4.1 pt
    wide.text(0.5, 0.5, "seven", fontsize=7)
    problems = drawn(wide)
    assert any("305 mm wide > 180 mm" in p for p in problems) and any("'seven': 4.1 pt" in p for p in problems)
    plt.close(wide)


def test_rotated_tick_labels_overlap_only_when_their_glyph_boxes_do():
    fig, ax = plt.subplots(figsize=figsize(70, "single"), layout="constrained")
    ax.set_xticks(range(4), [f"label number {i}" for i in range(4)], rotation=90)
    assert drawn(fig) == []  # axis-aligned extents of neighbours would not overlap either; rotated: fine
    ax.set_xticks(range(4), [f"label number {i}" for i in range(4)], rotation=30, ha="right",
                  rotation_mode="anchor")
    assert drawn(fig) == []  # their axis-aligned boxes intersect, the rotated text does not
    ax.set_xticks([0, 0.05, 2, 3], [f"label number {i}" for i in range(4)], rotation=30, ha="right",
                  rotation_mode="anchor")
    assert any("overlap" in p for p in drawn(fig))
    plt.close(fig)


def test_save_writes_the_exact_canvas_and_records_it(tmp_path):
    fig, ax = plt.subplots(figsize=figsize(50, "single"), layout="constrained")
    ax.plot([1, 2])
    with style.recording() as saved:
        paths = save(fig, tmp_path / "f.png")
    from PIL import Image
    assert Image.open(paths[0]).size == (int(88 / 25.4 * style.PNG_DPI), int(50 / 25.4 * style.PNG_DPI))
    assert saved[0]["problems"] == [] and saved[0]["width_mm"] == pytest.approx(WIDTH_MM["single"])
    assert (tmp_path / "f.pdf").read_bytes()[:5] == b"%PDF-"
    plt.close(fig)


def test_sizes_wrapping_and_pages():
    w, h = figsize(500)
    assert w * 25.4 == pytest.approx(180) and h * 25.4 == pytest.approx(MAX_HEIGHT_MM)
    lines = wrap("word " * 60, 88, 7).split("\n")
    assert len(lines) > 1 and all(len(line) <= 88 / (7 * 25.4 / 72 * 0.58) for line in lines)
    assert page_slices(23, 10) == [slice(0, 8), slice(8, 16), slice(16, 23)]
    assert page_slices(0, 10) == []


def test_a_legend_over_the_data_is_reported_one_outside_is_not():
    fig, ax = plt.subplots(figsize=figsize(70, "single"), layout="constrained")
    ax.plot([0, 1], [0, 1], label="encoder a")
    ax.plot([0, 1], [1, 0], label="encoder b")
    ax.legend(loc="upper right", title="encoders")
    problems = drawn(fig)
    assert any("legend 'encoders' covers the data area" in p for p in problems), problems
    ax.get_legend().remove()
    fig.legend(loc="outside lower center", ncol=2, title="encoders")  # below the panel: fine
    assert drawn(fig) == []
    plt.close(fig)
    fig, ax = plt.subplots(figsize=figsize(70, "single"), layout="constrained")
    ax.plot([0, 1], [0, 1], label="encoder a")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the panel: fine
    assert drawn(fig) == []
    plt.close(fig)
