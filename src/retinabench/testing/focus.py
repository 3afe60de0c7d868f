"""Small reliability tables with known numbers for FOCUS's tables and figures (tests/reliability/test_focus_tables.py,
tests/figures/test_focus_figures.py): four encoders (general VM, ophthalmic VM, a general dual encoder with probe and
zero-shot, a medical MLLM), two datasets of one harmonised task, two seeds, fairness and quality gaps, and LoRA
adapter comparisons."""
import pandas as pd

ENCODERS = {"gen_vm": {"domain": "natural", "method_group": "supervised", "params_m": 300.0},
            "oph_vm": {"domain": "cfp", "method_group": "masked_modelling", "params_m": 300.0},
            "clip": {"domain": "natural", "method_group": "image_text", "interfaces": ["features", "zeroshot"],
                     "params_m": 90.0},
            "medg": {"domain": "medical", "method_group": "instruction_tuning", "interfaces": ["mllm"],
                     "params_m": 4300.0}}
TASKS = {"d1_dr": {"dataset": "d1", "harmonised": "any_dr", "classes": ["no", "yes"]},
         "d2_dr": {"dataset": "d2", "harmonised": "any_dr", "classes": ["no", "yes"]}}
# (encoder, source, protocol) -> {dataset: (auroc, accuracy, auprc, ece)}; seed 1 is seed 0 + 0.02 on AUROC
MODELS = {("gen_vm", "frozen", "logreg"): {"d1": (0.80, 0.70, 0.60, 0.10), "d2": (0.70, 0.60, 0.50, 0.20)},
          ("oph_vm", "frozen", "logreg"): {"d1": (0.90, 0.80, 0.70, 0.05), "d2": (0.86, 0.76, 0.66, 0.07)},
          ("clip", "frozen", "logreg"): {"d1": (0.75, 0.65, 0.55, 0.12), "d2": (0.65, 0.55, 0.45, 0.14)},
          ("clip", "zeroshot", "zeroshot"): {"d1": (0.60, 0.50, 0.40, 0.30), "d2": (0.58, 0.50, 0.40, 0.30)},
          ("medg", "mllm", "mllm"): {"d1": (0.66, 0.60, 0.50, 0.25)}}


def focus_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metrics, gaps) in the collected reliability tables' columns that FOCUS's tables read."""
    mrows, grows = [], []
    for (enc, source, protocol), per in MODELS.items():
        for ds, (auroc, acc, auprc, ece) in per.items():
            task = f"{ds}_dr"
            for seed in (0, 1):
                key = {"source": source, "encoder": enc, "protocol": protocol, "dataset": ds, "task": task,
                       "train_task": task, "train_dataset": ds, "regime": "u-u", "seed": seed}
                for metric, thr, v in (("auroc", "none", auroc + 0.02 * seed), ("auprc", "none", auprc),
                                       ("ece", "none", ece), ("ece_top_label", "none", 0.99),
                                       ("accuracy", "y_pred", acc), ("accuracy", "youden", 0.0)):
                    mrows.append({**key, "threshold": thr, "metric": metric, "value": v})
                # fairness gaps: sex (acc 0.1, auroc 0.2, eq-odds 0.3), age_median acc 0.05; a skipped one; quality
                for kind, attr, metric, gap, skipped in (
                        ("fairness", "sex", "accuracy", 0.1, False), ("fairness", "sex", "auroc", 0.2, False),
                        ("fairness", "sex", "equalized_odds", 0.3, False),
                        ("fairness", "age_median", "accuracy", 0.05, False),
                        ("fairness", "sex", "tpr", 0.9, False),              # not a FOCUS fairness component
                        ("fairness", "site", "accuracy", 0.9, False),        # not a fairness score attribute
                        ("fairness", "age_median", "auroc", 0.9, True),      # skipped: left out
                        ("quality", "quality", "ece", 0.04 if ds == "d1" else 0.08, False)):
                    if enc == "medg" and kind == "quality":
                        continue
                    grows.append({**key, "threshold": "y_pred", "kind": kind, "attribute": attr, "metric": metric,
                                  "abs_gap": gap, "skipped": skipped})
    # a transfer row must be ignored
    mrows.append({**mrows[0], "source": "transfer", "value": 0.0})
    return pd.DataFrame(mrows), pd.DataFrame(grows)


def focus_comparisons() -> pd.DataFrame:
    """LoRA adapter comparisons (lora/deltas/comparisons.parquet columns the FOCUS outputs read)."""
    rows = []
    for enc, dom, tt, ds, d_auroc in (("m1", "in-domain", "a_dr", "a", 0.10), ("m1", "out-of-domain", "a_dr", "b", -0.02),
                                      ("m1", "out-of-domain", "a_dr", "c", 0.00), ("m2", "in-domain", "a_dr", "a", 0.06)):
        for metric, base in (("auroc", 0.7), ("ece", 0.2)):
            d = d_auroc if metric == "auroc" else -d_auroc / 2
            rows.append({"encoder": enc, "protocol": "mllm", "domain": dom, "train_dataset": "a", "train_task": tt,
                         "dataset": ds, "task": f"{ds}_dr", "variant": "invalid_wrong", "metric": metric,
                         "metric_family": metric, "value_base": base, "value_adapter": base + d, "delta": d,
                         "skipped": False})
    return pd.DataFrame(rows)
