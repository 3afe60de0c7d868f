"""Saliency and compute figures from synthetic tables: files written, layout decisions, clear errors."""
import numpy as np
import pandas as pd
import pytest

from retinabench.compute import COMPUTE_COLUMNS
from retinabench.figures.compute import FIGURES, compute_figures
from retinabench.figures.saliency import saliency_figure
from retinabench.saliency import SALIENCY_COLUMNS

ENCODERS = {"enc_a": {"domain": "natural"}, "enc_b": {"domain": "cfp"}, "enc_c": {"domain": "oct"}}
TASK = {"name": "t", "classes": ["none", "npdr", "pdr"]}


def saliency_result(enc, image_ids, protocols=("finetune", "linear_aug"), size=32):
    rng = np.random.default_rng(len(enc))
    rows = []
    for _p, protocol in enumerate(protocols):
        for k, (c, i) in enumerate(image_ids):
            rows.append({**{col: None for col in SALIENCY_COLUMNS}, "encoder": enc, "task": "t", "protocol": protocol,
                         "class_index": c, "class": TASK["classes"][c], "image_id": i, "y_true": c, "y_pred": c,
                         "predicted": TASK["classes"][c], "p_predicted": 0.7, "correct": k % 2 == 0,
                         "nt_type": "smoothgrad", "nt_samples": 50, "stdev": 0.3, "n_steps": 50})
    n = len(image_ids)
    maps = {"image": rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8),
            "clahe": rng.random((len(protocols), n, size, size)).astype(np.float32),
            "protocols": np.array(protocols), "image_ids": np.array([i for _, i in image_ids])}
    return pd.DataFrame(rows, columns=SALIENCY_COLUMNS), maps


def test_saliency_figure_writes_png_and_pdf_with_an_empty_class(tmp_path):
    images = [(0, "img1"), (1, "img2")]  # class 2 has no test image
    results = {e: saliency_result(e, images) for e in ("enc_a", "enc_b")}
    paths = saliency_figure(TASK, results, ENCODERS, tmp_path / "s.png", protocols=["finetune", "linear_aug"])
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "pdf"]
    assert (tmp_path / "s.png").stat().st_size > 5_000
    with pytest.raises(ValueError, match="no encoder results"):
        saliency_figure(TASK, {}, ENCODERS, tmp_path / "x.png", protocols=["finetune"])


def compute_table():
    rows = []
    for j, enc in enumerate(ENCODERS):
        for phase, mult in (("inference", 1), ("finetune", 8), ("linear_aug", 3)):
            rows.append({**{c: None for c in COMPUTE_COLUMNS}, "encoder": enc, "phase": phase, "device": "cpu",
                         "device_name": "test cpu", "dtype": "fp32", "batch_size": 1 if phase == "inference" else 64,
                         "threads": 2, "seconds_median": 0.01 * mult * (3 - j), "seconds_p90": 0.012 * mult * (3 - j),
                         "peak_mem_mb": 50.0 * mult * (j + 1), "peak_mem_kind": "rss_hwm_delta"})
    return pd.DataFrame(rows, columns=COMPUTE_COLUMNS)


def test_compute_figures_write_all_four(tmp_path):
    outs = {f: str(tmp_path / f"{f}.png") for f in FIGURES}
    paths = compute_figures(compute_table(), ENCODERS, outs)
    assert len(paths) == 8 and all((tmp_path / f"{f}.png").stat().st_size > 5_000 for f in FIGURES)
    with pytest.raises(KeyError, match="no output path"):
        compute_figures(compute_table(), ENCODERS, {"inference_memory": outs["inference_memory"]})
    with pytest.raises(ValueError, match="no training rows"):
        t = compute_table()
        compute_figures(t[t["phase"] == "inference"], ENCODERS, outs)


def test_saliency_and_compute_figures_fit_the_print_targets(tmp_path):
    """The print targets of figures/style.py (size, no text off the canvas, legends outside the data) hold for
    the saliency grid and the four compute figures too."""
    from retinabench.figures.style import MAX_HEIGHT_MM, WIDTH_MM, recording
    images = [(0, "img1"), (1, "img2"), (2, "img3")]
    results = {e: saliency_result(e, images) for e in ENCODERS}
    with recording() as saved:
        saliency_figure(TASK, results, ENCODERS, tmp_path / "s.png", protocols=["finetune", "linear_aug"])
        compute_figures(compute_table(), ENCODERS, {f: str(tmp_path / f"{f}.png") for f in FIGURES})
    assert len(saved) == 1 + len(FIGURES)
    assert {s["path"]: s["problems"] for s in saved if s["problems"]} == {}
    assert all(s["width_mm"] <= WIDTH_MM["double"] + 0.5 and s["height_mm"] <= MAX_HEIGHT_MM + 0.5 for s in saved)
