"""The protocol-sensitivity table: each convention of ``reliability.protocol_sensitivity.conventions`` run both ways
on the same inputs (docs/reliability.md, "Protocol sensitivity"; the comparison itself: retinabench.reliability.
sensitivity).

* probe conventions (``logreg.variant``, ``features.probe_embedding``, ``input_size``): the logistic probe refitted
  on the same cached features of each (encoder, task) — the two variants' probes, or one probe on the two
  embeddings — and its test predictions compared;
* ``mllm.invalid_answers``: the same MLLM predictions (parsed answers, p_yes), invalid answers kept as wrong or
  dropped;
* ``reliability.ece_bin_edges``: ECE of the same predictions under both bin edges;
* ``reliability.bootstrap.summary`` / ``unit``: the paired model comparisons (retinabench.reliability.paired)
  recomputed under both values; compared: each CI's width and its significance call.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from retinabench.metrics.fairness import Attribute
from retinabench.reliability.evaluation import attach_manifest, resampling_units
from retinabench.reliability.paired import MODEL_KEYS, paired_comparisons
from retinabench.reliability.sensitivity import (COLUMNS, COMPARISON, Variant, add_calls, fairness_groups,
                                                 paired_variant_rows, significance_call, skipped_row)
from retinabench.settings.protocols import LogregSettings
from retinabench.settings.reliability import SENSITIVITY_CONVENTIONS, ReliabilitySettings

PROBE_CONVENTIONS = ("logreg.variant", "features.probe_embedding", "input_size")
BOOTSTRAP_CONVENTIONS = {"reliability.bootstrap.summary": "summary", "reliability.bootstrap.unit": "unit"}
Features = tuple[pd.Index, np.ndarray]


def l2_normalised(feats: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm: ``projected_l2`` of an entry without a joint image-text space is its pooled
    embedding L2-normalised (retinabench.features.extract.build_probe_encoder), so it is derived from the
    ``pre_projection`` features rather than extracted again."""
    x = np.asarray(feats, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def refit_probe(ids: pd.Index, feats: np.ndarray, split: pd.DataFrame, n_classes: int, logreg: LogregSettings,
                regime: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The logistic probe of ``logreg`` (retinabench.protocols.logreg) fitted on the training rows of ``regime``,
    its class probabilities on the test rows: (test rows of the split, probabilities)."""
    from retinabench.data.splits import regime_rows
    from retinabench.protocols import logreg as probe
    from retinabench.regimes import Regime
    r = Regime.parse(regime)
    where = {image_id: i for i, image_id in enumerate(ids)}
    parts = {}
    for part, balanced in (("train", r.train_balanced), ("test", r.test_balanced)):
        rows = regime_rows(split, part, balanced)
        missing = [i for i in rows["image_id"] if i not in where]
        if missing:
            raise KeyError(f"protocol sensitivity: {len(missing)} {part} images of task "
                           f"{split['task'].iloc[0]!r} have no features, e.g. {missing[:3]}")
        parts[part] = (rows, np.fromiter((where[i] for i in rows["image_id"]), np.int64, len(rows)))
    (tr, tr_idx), (te, te_idx) = parts["train"], parts["test"]
    fitted, _ = probe.fit(feats[tr_idx], tr["y"].to_numpy(), None, None, n_classes, seed=0,
                          balanced=r.train_balanced, settings=logreg)
    return te.reset_index(drop=True), probe.predict(fitted, feats[te_idx])


class SensitivityInputs:
    """What every convention reads: the reliability settings, task registry entries, the manifest and the
    fairness attributes compared."""

    def __init__(self, settings: ReliabilitySettings, tasks: Mapping[str, dict], manifest: pd.DataFrame):
        self.settings, self.tasks, self.manifest = settings, tasks, manifest
        s = settings.protocol_sensitivity
        names = s.attributes if s.attributes is not None else settings.fairness_score_attributes
        known = {a.name: a for a in settings.attributes}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise KeyError(f"reliability.protocol_sensitivity.attributes {unknown}: not in reliability.attributes "
                           f"{sorted(known)}")
        self.attributes = [Attribute.from_settings(known[n], kind="fairness", min_group_size=settings.min_group_size)
                           for n in names]
        self.families: list[str] = [str(m) for m in s.metrics]

    def attach(self, rows: pd.DataFrame) -> pd.DataFrame:
        """``rows`` (dataset, image_id) with the manifest's patient and the compared attributes' columns (any
        manifest column, e.g. eye); every image must be in the manifest."""
        return attach_manifest(rows, self.manifest, tuple(a.column for a in self.attributes), standard=False,
                               what="protocol sensitivity: compared")

    def compare(self, convention: str, rows: pd.DataFrame, a: Variant, b: Variant, keys: dict,
                families: list[str] | None = None) -> list[dict]:
        """:func:`~retinabench.reliability.sensitivity.paired_variant_rows` on test ``rows`` (dataset, image_id,
        y_true or y), the manifest's patients and attributes attached."""
        s = self.settings
        y = (rows["y_true"] if "y_true" in rows else rows["y"]).to_numpy()
        with_manifest = self.attach(rows[["dataset", "image_id"]].reset_index(drop=True))
        n_classes = len(self.tasks[keys["task"]]["classes"])
        return paired_variant_rows(
            convention, SENSITIVITY_CONVENTIONS[convention], a, b, y,
            resampling_units(with_manifest, s.bootstrap.unit), families or self.families, n_classes,
            groups=fairness_groups(with_manifest, self.attributes), n_boot=s.bootstrap.n_boot,
            level=s.bootstrap.level, seed=s.bootstrap.seed, n_bins=s.n_bins, keys=keys)


def probe_rows(inp: SensitivityInputs, convention: str, features: Mapping[str, Features | str], logreg: dict,
               split: pd.DataFrame, encoder: str, task: str) -> list[dict]:
    """One (encoder, task) of a probe convention. ``features``: {value: (ids, features) or the reason it is not
    compared} of the convention's two values (``logreg.variant``: the config's features under both values);
    ``logreg``: the config's ``logreg:`` section."""
    values = SENSITIVITY_CONVENTIONS[convention]
    dataset = inp.tasks[task]["dataset"]
    keys = {"source": "frozen", "encoder": encoder, "protocol": "logreg", "task": task, "dataset": dataset}
    given = [features[v] for v in values]
    reasons = [f for f in given if isinstance(f, str)]
    if reasons:
        return [skipped_row(convention, values, reasons[0], **keys)]
    n_classes = len(inp.tasks[task]["classes"])
    regime = inp.settings.protocol_sensitivity.regime
    fits = []
    for v, f in zip(values, given):
        assert not isinstance(f, str)
        ids, feats = f
        section = {**logreg, "variant": v, "max_iter": "auto"} if convention == "logreg.variant" else logreg
        fits.append(refit_probe(ids, feats, split, n_classes, LogregSettings.of(section), regime))
    (rows, pa_), (_, pb) = fits
    rows = rows.assign(dataset=dataset)
    return inp.compare(convention, rows, Variant(pa_, pa_.argmax(1)), Variant(pb, pb.argmax(1)), keys)


def _test_cells(preds: pd.DataFrame, regime: str):
    """(keys, rows, probabilities) of each (source, encoder, protocol, task) of the test rows of ``regime``, its
    lowest seed."""
    t = preds[(preds["split"] == "test") & (preds["regime"] == regime)]
    for (source, encoder, protocol, task), g in t.groupby(["source", "encoder", "protocol", "task"], sort=True):
        g = g[g["seed"] == g["seed"].min()].reset_index(drop=True)
        yield {"source": source, "encoder": encoder, "protocol": protocol, "task": task,
               "dataset": str(g["dataset"].iloc[0])}, g


def invalid_answer_rows(inp: SensitivityInputs, preds: pd.DataFrame, configured: str) -> list[dict]:
    """``mllm.invalid_answers``: the MLLM predictions (rows with a generated ``answer``) with the invalid answers
    (y_pred −1) kept as wrong or dropped; both from one table written with ``keep_as_wrong``."""
    convention = "mllm.invalid_answers"
    values = SENSITIVITY_CONVENTIONS[convention]
    if configured == "drop":
        return [skipped_row(convention, values, "the MLLM predictions were written with mllm.invalid_answers: drop "
                                                "(the invalid rows are gone); run with keep_as_wrong")]
    answered = preds[preds["answer"].notna()] if "answer" in preds else preds.iloc[0:0]
    if answered.empty:
        return [skipped_row(convention, values, "no MLLM predictions (mllm.enabled, a generated answer) in this run")]
    out = []
    for keys, g in _test_cells(answered, inp.settings.protocol_sensitivity.regime):
        proba = g[[f"p_{c}" for c in inp.tasks[keys["task"]]["classes"]]].to_numpy(np.float64)
        pred = g["y_pred"].to_numpy(np.int64)
        out += inp.compare(convention, g, Variant(proba, pred), Variant(proba, pred, keep=pred != -1), keys)
    return out


def ece_edge_rows(inp: SensitivityInputs, preds: pd.DataFrame) -> list[dict]:
    """``reliability.ece_bin_edges``: ECE (binary: positive class; multi-class: top label) of the same predictions
    under both bin edges (its other metrics do not depend on the edges)."""
    convention = "reliability.ece_bin_edges"
    a_edges, b_edges = SENSITIVITY_CONVENTIONS[convention]
    if "ece" not in inp.families:
        return [skipped_row(convention, (a_edges, b_edges), "ece is not in protocol_sensitivity.metrics")]
    out = []
    for keys, g in _test_cells(preds, inp.settings.protocol_sensitivity.regime):
        proba = g[[f"p_{c}" for c in inp.tasks[keys["task"]]["classes"]]].to_numpy(np.float64)
        pred = g["y_pred"].to_numpy(np.int64)
        out += inp.compare(convention, g, Variant(proba, pred, edges=a_edges), Variant(proba, pred, edges=b_edges),
                           keys, families=["ece"])
    return out


def bootstrap_rows(inp: SensitivityInputs, convention: str, preds: pd.DataFrame,
                   encoder_order: list[str]) -> list[dict]:
    """``reliability.bootstrap.summary`` (domain-level rows) or ``unit`` (comparison-level rows): the paired
    comparisons of :func:`~retinabench.reliability.paired.paired_comparisons` under both values, the other settings
    as configured; per comparison, value = the width of its CI, call = its significance."""
    values = SENSITIVITY_CONVENTIONS[convention]
    key = BOOTSTRAP_CONVENTIONS[convention]
    s = inp.settings
    names = {"reliability.bootstrap.summary": "domain-level", "reliability.bootstrap.unit": "comparison-level"}
    runs = []
    for v in values:
        plain = s.plain()
        plain["bootstrap"][key] = v
        plain["paired"]["metrics"] = list(inp.families)
        plain["paired"]["regime"] = s.protocol_sensitivity.regime
        comp, dom = paired_comparisons(preds, inp.manifest, dict(inp.tasks), ReliabilitySettings.of(plain),
                                       encoder_order)
        t = dom if key == "summary" else comp
        if "skipped" in t:
            t = t[~t["skipped"].astype(bool)]
        runs.append(t)
    a, b = runs
    if a.empty:
        return [skipped_row(convention, values, f"no {names[convention]} paired comparison (needs two models on a "
                                                "task)")]
    where = ["metric_family", "domain_field", "domain"] if key == "summary" else ["metric", "train_task", "task"]
    join = [f"{k}_{side}" for side in ("a", "b") for k in MODEL_KEYS] + where
    m = a.merge(b, on=join, suffixes=("_va", "_vb"), validate="one_to_one")
    out = []
    for r in m.to_dict("records"):
        wa, wb = r["ci_high_va"] - r["ci_low_va"], r["ci_high_vb"] - r["ci_low_vb"]
        task = f"{r['domain_field']}={r['domain']}" if key == "summary" else r["task"]
        out.append({"convention": convention, "variant_a": values[0], "variant_b": values[1],
                    "source": r["source_a"], "encoder": f"{r['encoder_b']} - {r['encoder_a']}",
                    "protocol": r["protocol_a"], "task": task,
                    "dataset": "" if key == "summary" else inp.tasks[r["task"]]["dataset"],
                    "metric": f"{r['metric_family' if key == 'summary' else 'metric']} delta CI width",
                    "attribute": "", "value_a": wa, "value_b": wb, "delta": wb - wa, "ci_low": np.nan,
                    "ci_high": np.nan, "p_value": np.nan,
                    "n_a": int(r["n_comparisons_va"] if key == "summary" else r["n_images_va"]),
                    "n_b": int(r["n_comparisons_vb"] if key == "summary" else r["n_images_vb"]),
                    "n_units": int(r["n_comparisons_va"] if key == "summary" else r["n_patients_va"]),
                    "conclusion": COMPARISON, "call_a": significance_call(r["ci_low_va"], r["ci_high_va"]),
                    "call_b": significance_call(r["ci_low_vb"], r["ci_high_vb"]), "skipped": False, "reason": ""})
    return out


def protocol_sensitivity(inp: SensitivityInputs, *, preds: pd.DataFrame, features: Mapping, splits: Mapping,
                         logreg: dict, configured: Mapping[str, str], encoder_order: list[str]) -> pd.DataFrame:
    """The table (columns :data:`~retinabench.reliability.sensitivity.COLUMNS`) of every configured convention.

    ``preds``: every predictions table of the run (retinabench.reliability.prepare_predictions, sources
    concatenated); ``features``: {(convention, encoder, task): {value: (ids, features) or a reason}} for the probe
    conventions; ``splits``: {task: split table}; ``logreg``: the config's ``logreg:`` section; ``configured``: the
    config's value of each convention; ``encoder_order``: the config's encoders (paired pairs' order)."""
    rows: list[dict] = []
    for convention in inp.settings.protocol_sensitivity.conventions:
        if convention in PROBE_CONVENTIONS:
            cells = sorted(k for k in features if k[0] == convention)
            if not cells:
                rows.append(skipped_row(convention, SENSITIVITY_CONVENTIONS[convention],
                                        "no encoder with cached features in this run"))
            for _, encoder, task in cells:
                rows += probe_rows(inp, convention, features[(convention, encoder, task)], logreg, splits[task],
                                   encoder, task)
        elif convention == "mllm.invalid_answers":
            rows += invalid_answer_rows(inp, preds, configured[convention])
        elif convention == "reliability.ece_bin_edges":
            rows += ece_edge_rows(inp, preds)
        else:
            rows += bootstrap_rows(inp, convention, preds, encoder_order)
    return add_calls(pd.DataFrame(rows, columns=COLUMNS) if not rows else pd.DataFrame(rows))

