"""The metric table: one declared record per metric the benchmark reports (as lmms-eval's ``metric_list`` states
a task's metrics) — its name, the one function that computes it (retinabench.metrics.point), whether higher is
better, how it aggregates over classes, what it needs (probabilities or hard decisions), which tasks it applies
to and its display name. Every consumer asks the table: ranks and critical-difference diagrams (direction), the
reliability layer (threshold-free metrics, metric families, the form of a family on a binary or multi-class
task), the adapter deltas (direction, labels), the tables (display as a percentage).

Names and families: a *family* is the quantity (``auroc``); its names are its forms. ``auroc_macro`` is an alias
of ``auroc`` (the same function: on a multi-class task ``auroc`` is the macro one-vs-rest AUROC), the name the
reliability tables give the multi-class form; ``f1`` (positive class) and ``f1_macro`` are two metrics of one
family, as are ``ece`` (positive class) and ``ece_top_label``. Which names each results table reports, in its
row order, is declared here too (:data:`METRICS_TABLE`, :data:`RELIABILITY_BINARY`, ...).

Torch- and scikit-learn-free to import (the workflow's parse may read it).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from retinabench.metrics import point
from retinabench.metrics.point import Scored

# How a metric combines classes: over all rows; the positive (second) class of a binary task; the unweighted
# mean over classes (one-vs-rest for ranking metrics); the positive class on binary and the macro mean on
# multi-class tasks; the top-label confidence against top-label correctness.
AGGREGATIONS = ("overall", "positive_class", "macro", "positive_class_or_macro", "top_label")
NEEDS = ("probabilities", "labels", "gaps")
TASKS = ("any", "binary", "multiclass")


@dataclass(frozen=True)
class Metric:
    name: str
    display: str
    family: str
    higher_is_better: bool | None           # None: no better direction (a rate that describes, e.g. ppr)
    aggregation: str
    needs: str                              # probabilities | labels | gaps (a gap of other metrics)
    tasks: str = "any"
    compute: Callable[[Scored], float] | None = None   # None: not a point estimate (equalized_odds: a gap)
    percent: bool = True                    # shown as a percentage (kappa: a coefficient)
    alias_of: str | None = None             # the same function under another name

    def __post_init__(self):
        for field, value, allowed in (("aggregation", self.aggregation, AGGREGATIONS), ("needs", self.needs, NEEDS),
                                      ("tasks", self.tasks, TASKS)):
            if value not in allowed:
                raise ValueError(f"metric {self.name!r}: {field} {value!r} is not one of {allowed}")

    def point(self, scored: Scored) -> float:
        """The metric on ``scored``; an error naming a metric that is not a point estimate."""
        if self.compute is None:
            raise ValueError(f"metric {self.name!r} is not a point estimate (it needs {self.needs})")
        return self.compute(scored)

    def applies_to(self, n_classes: int) -> bool:
        return self.tasks == "any" or (self.tasks == "binary") == (n_classes == 2)


_P, _L = "probabilities", "labels"
_DECLARED = (
    Metric("accuracy", "Accuracy", "accuracy", True, "overall", _L, compute=point.accuracy),
    Metric("balanced_accuracy", "Balanced accuracy", "balanced_accuracy", True, "macro", _L,
           compute=point.balanced_accuracy),
    Metric("auroc", "AUROC", "auroc", True, "positive_class_or_macro", _P, compute=point.auroc),
    Metric("auroc_macro", "AUROC", "auroc", True, "macro", _P, "multiclass", point.auroc, alias_of="auroc"),
    Metric("auprc", "AUPRC", "auprc", True, "positive_class_or_macro", _P, compute=point.auprc),
    Metric("auprc_macro", "AUPRC", "auprc", True, "macro", _P, "multiclass", point.auprc, alias_of="auprc"),
    Metric("f1", "F1", "f1", True, "positive_class", _L, "binary", point.f1),
    Metric("f1_macro", "Macro F1", "f1", True, "macro", _L, compute=point.f1_macro),
    Metric("kappa", "Cohen's kappa", "kappa", True, "overall", _L, compute=point.kappa, percent=False),
    Metric("ece", "ECE", "ece", False, "positive_class", _P, "binary", point.ece),
    Metric("ece_top_label", "Top-label ECE", "ece", False, "top_label", _P, compute=point.ece_top_label),
    Metric("ppr", "Predicted-positive rate", "ppr", None, "positive_class", _L, "binary", point.ppr),
    Metric("tpr", "TPR", "tpr", True, "positive_class", _L, "binary", point.tpr),
    Metric("fpr", "FPR", "fpr", False, "positive_class", _L, "binary", point.fpr),
    Metric("tpr_macro", "Macro TPR", "tpr", True, "macro", _L, "multiclass", point.tpr_macro),
    Metric("fpr_macro", "Macro FPR", "fpr", False, "macro", _L, "multiclass", point.fpr_macro),
    Metric("invalid_rate", "Invalid rate", "invalid_rate", False, "overall", _L, compute=point.invalid_rate),
    Metric("accuracy_valid", "Accuracy (valid answers)", "accuracy_valid", True, "overall", _L,
           compute=point.accuracy_valid),
    Metric("equalized_odds", "Equalized-odds gap", "equalized_odds", False, "overall", "gaps"),
)
METRICS: dict[str, Metric] = {m.name: m for m in _DECLARED}

# What each results table reports, in its row order.
METRICS_TABLE = ("accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece", "ece_top_label")
ANSWER_METRICS = ("invalid_rate", "accuracy_valid")   # added for generated-answer predictions
RELIABILITY_BINARY = ("auroc", "auprc", "accuracy", "f1", "ece", "ece_top_label", "ppr", "tpr", "fpr")
RELIABILITY_MULTICLASS = ("auroc_macro", "auprc_macro", "accuracy", "f1_macro", "ece_top_label", "tpr_macro",
                          "fpr_macro")


def metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; the metric table (retinabench.metrics.table) knows "
                       f"{sorted(METRICS)}") from None


def higher_is_better(name: str) -> bool:
    m = metric(name)
    if m.higher_is_better is None:
        raise ValueError(f"metric {name!r} has no better direction; it cannot rank or be compared as better/worse")
    return m.higher_is_better


def metric_family(name: str) -> str:
    """The quantity a name measures: auroc_macro -> auroc, ece_top_label -> ece, f1_macro -> f1."""
    return metric(name).family


def display_name(name: str) -> str:
    return metric(name).display


def metric_family_names(fam: str) -> tuple[str, ...]:
    """Every name of a family, in table order (``auroc`` -> auroc, auroc_macro)."""
    out = tuple(m.name for m in _DECLARED if m.family == fam)
    if not out:
        raise KeyError(f"unknown metric family {fam!r}; known: {sorted({m.family for m in _DECLARED})}")
    return out


_FORM_PREFERENCE = {True: ("positive_class", "positive_class_or_macro", "overall"),
                    False: ("macro", "top_label", "overall")}


def reliability_name(fam: str, n_classes: int) -> str:
    """The name a family takes in the reliability tables on a task with ``n_classes`` classes: on binary tasks
    the positive-class form (f1, ece, auroc), on multi-class tasks the macro form (f1_macro, auroc_macro), else
    the top-label one (ece_top_label), else the overall one (accuracy)."""
    forms = {metric(n).aggregation: n for n in metric_family_names(fam) if metric(n).applies_to(n_classes)}
    for aggregation in _FORM_PREFERENCE[n_classes == 2]:
        if aggregation in forms:
            return forms[aggregation]
    raise KeyError(f"metric family {fam!r} has no form for a {n_classes}-class task")


def threshold_free() -> frozenset[str]:
    """Metrics computed from the probabilities: the same under every decision rule."""
    return frozenset(m.name for m in _DECLARED if m.needs == "probabilities")


def metrics_table_names(n_classes: int) -> tuple[str, ...]:
    """The metrics table's metrics for a task with ``n_classes`` classes (multi-class: no positive-class ECE)."""
    return tuple(n for n in METRICS_TABLE if metric(n).applies_to(n_classes))


def reliability_names(n_classes: int) -> tuple[str, ...]:
    return RELIABILITY_BINARY if n_classes == 2 else RELIABILITY_MULTICLASS
