"""Which analysis families a config produces (no empty placeholders) and what each job is given."""
import copy
from pathlib import Path

import pytest
import yaml

from retinabench.analysis import FAMILIES, AnalysisContext
from retinabench.plan.family_outputs import analysis_outputs, family_inputs
from retinabench.settings import AnalysisSettings, ConfigError
from retinabench.plan.selection import plan

REPO = Path(__file__).resolve().parents[2]
ANALYSIS_DEFAULTS = AnalysisSettings().plain()


def load_config(*overrides: dict) -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for o in overrides:
        config.update(copy.deepcopy(o))
    for key in ("datasets", "tasks", "encoders"):
        config["registries"][key] = str(REPO / config["registries"][key])
    return config


def families(config: dict) -> dict:
    p = plan(config)
    ctx = AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    return analysis_outputs(ctx, "R")


def context(config: dict) -> AnalysisContext:
    p = plan(config)
    return AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)


def test_phantom_demo_families():
    out = families(load_config())
    assert set(out) == {"ranks", "rank_figures", "tables", "cd", "protocol_heatmap", "agreement", "distance",
                        "subsets", "top_k", "attributes", "fairness"}
    # the fairness scatter is on by default: it reads the reliability layer's subgroup table, no path to set
    ctx = context(load_config())
    assert family_inputs("fairness", "R", ctx) == {"subgroups": "R/reliability/subgroup_metrics.parquet"}
    # no fine-tuning: the single-protocol analyses fall back to the configured protocol and say so
    assert ctx.analysis_protocol == {"protocol": "linear", "role": "fallback", "note": "fallback: finetune not run"}
    assert ctx.protocol_label == "linear (fallback: finetune not run)"
    assert out["rank_figures"]["png"] == "R/figures/rank_distribution.png"
    assert out["rank_figures"]["pdf_auroc"] == "R/figures/rank_distribution_auroc.pdf"
    assert set(out["cd"]) >= {"friedman", "nemenyi", "png", "pdf", "png_balanced_accuracy", "png_auroc"}
    # phantom: one low-risk dataset nobody saw -> re-ranking would change nothing -> no leakage figure
    assert "leakage" not in out and "ft_lp" not in out and "sensitivity" not in out
    # fewer than two of the paper's protocols ranked (knn only): the protocol figures show every ranked protocol, no
    # extended twin; no linear_aug ranked: no Fig. 4 / A.3
    assert ctx.protocol_sets == {"": ["knn", "linear", "logreg"]}
    assert "png_extended" not in out["protocol_heatmap"] and "png_linear_probe" not in out["rank_figures"]
    # Table 1 from the phantom's manifest, with the fairness analysis' binarisation of age and sex
    assert out["attributes"] == {"attributes_csv": "R/tables/attribute_distribution.csv",
                                 "attributes_tex": "R/tables/attribute_distribution.tex"}
    assert family_inputs("attributes", "R", ctx) == {"manifests": [f"R/data/{d}/manifest.parquet" for d in ctx.datasets]}
    assert ctx.attributes == [{"name": "age", "column": "age", "cut": 60, "groups": None},
                              {"name": "sex", "column": "sex", "cut": None, "groups": ["female", "male"]}]


def test_two_encoders_have_no_rank_tests():
    out = families(load_config({"encoders": ["efficientnet_lite0_in1k", "vit_tiny_random"]}))
    assert "cd" not in out and "agreement" not in out
    assert "distance" in out and "protocol_heatmap" in out


def test_tvhl_like_config_has_no_top_k_after_excluding_its_high_risk_dataset():
    out = families(load_config({"datasets": ["tvhl"], "encoders": ["efficientnet_lite0_in1k", "resnet18_random"]}))
    assert "leakage" not in out and "cd" not in out
    # its OCT tasks still have the paper's OCT panel (every OCT task, leakage not excluded); no leakage-free top-k
    assert set(out["top_k"]) == {"table_oct", "png_oct", "pdf_oct"}
    assert {"ranks", "rank_figures", "tables", "protocol_heatmap", "distance", "subsets"} <= set(out)


def test_single_protocol_single_regime_keeps_only_what_is_defined():
    out = families(load_config({"protocols": ["knn"], "regimes": ["u-u"], "analysis": ANALYSIS_DEFAULTS |
                                {"fallback_protocol": "knn"}}))
    assert "protocol_heatmap" not in out and "agreement" not in out
    assert set(out["distance"]) == {"table", "kruskal", "png_subsets", "pdf_subsets"}


def test_future_inputs_switch_their_families_on():
    ctx = AnalysisContext(encoders={e: {"domain": "natural", "method": "m", "exposure": [], "params_m": 1.0}
                                    for e in "abc"},
                          tasks={"t1": {"dataset": "d", "modality": "cfp", "family": "x"}},
                          datasets={"d": {"web_exposure_risk": "low"}},
                          protocols=["knn", "linear", "finetune", "linear_aug"],
                          regimes=["u-u"], ranking={"metric": "accuracy", "regime": "u-u"},
                          settings=ANALYSIS_DEFAULTS | {"subgroup_metrics": "subgroups/metrics.parquet"},
                          lr_source="lr/metrics.parquet")
    out = analysis_outputs(ctx, "R")
    assert {"ft_lp", "fairness", "sensitivity"} <= set(out)
    assert family_inputs("fairness", "R", ctx) == {"subgroups": "R/subgroups/metrics.parquet"}
    assert family_inputs("sensitivity", "R", ctx)["lr_sweep"] == "R/lr/metrics.parquet"


def test_fine_tuning_joins_the_rankings_only_with_full_coverage():
    full = {"finetune": {"enabled": True, "protocols": ["finetune", "linear_aug"], "encoders": None,
                         "tasks": None, "regimes": None}}
    config = load_config(full)
    p = plan(config)
    ctx = AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    assert ctx.protocols == ["knn", "linear", "logreg", "finetune", "linear_aug"]
    # the paper's headline protocol once it is ranked, whatever the order of `protocols`
    assert ctx.analysis_protocol["protocol"] == "finetune" and ctx.analysis_protocol["role"] == "headline"
    assert ctx.protocol_label == "finetune"
    out = analysis_outputs(ctx, "R")
    assert "ft_lp" in out and "sensitivity" in out  # the sweep is on by default with fine-tuning
    assert ctx.settings["linear_protocol"] == "linear_aug"  # FT - LP gap: the paper's augmented linear probe
    assert family_inputs("sensitivity", "R", ctx)["lr_sweep"] == "R/sweep/lr_sensitivity.parquet"
    # sensitivity on the sweep task; the second fine-tuned task is the transfer check of the chosen lr
    # (every fine-tuned encoder checked there, in the sweep's regime, unless sweep.sensitivity_* say otherwise)
    assert ctx.sweep_tasks == {"sweep": p.tasks[0], "check": p.tasks[1], "check_regime": "u-u",
                               "check_encoders": p.encoders}
    assert family_inputs("lr_transfer", "R", ctx) == {"lr_grid": "R/sweep/lr_sweep_metrics.parquet",
                                                      "lr_sweep": "R/sweep/lr_sensitivity.parquet",
                                                      "baselines": "R/analysis/baselines.csv"}
    no_aug = context(load_config({"finetune": full["finetune"] | {"protocols": ["finetune"]}}))
    assert "ft_lp" not in analysis_outputs(no_aug, "R")  # the cached-feature `linear` probe is not the paper's LP
    no_check = context(load_config({"finetune": full["finetune"], "sweep": {"sensitivity_task": None}}))
    out = analysis_outputs(no_check, "R")
    assert "sensitivity" in out and "lr_transfer" not in out
    subset = load_config({"finetune": full["finetune"] | {"encoders": ["efficientnet_lite0_in1k"]},
                          "sweep": {"enabled": False}})
    p = plan(subset)
    ctx = AnalysisContext.from_config(subset, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    assert ctx.protocols == ["knn", "linear", "logreg"] and ctx.ft_protocols == ["finetune", "linear_aug"]
    assert ctx.analysis_protocol == {"protocol": "linear", "role": "fallback",
                                     "note": "fallback: finetune covers only 1 of 3 encoders"}
    out = analysis_outputs(ctx, "R")
    assert "ft_lp" in out and "sensitivity" not in out
    one_swept = load_config({"finetune": full["finetune"] | {"encoders": ["efficientnet_lite0_in1k"]}})
    p = plan(one_swept)
    ctx = AnalysisContext.from_config(one_swept, p.registries, encoders=p.encoders, tasks=p.tasks,
                                      datasets=p.datasets)
    assert set(analysis_outputs(ctx, "R")["sensitivity"]) == {"table", "png", "pdf"}  # one encoder: no ranks
    only_bb = load_config({"finetune": full["finetune"] | {"regimes": ["b-b"]}})
    p = plan(only_bb)
    ctx = AnalysisContext.from_config(only_bb, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    assert "ft_lp" not in analysis_outputs(ctx, "R")  # no fine-tuning rows in the primary regime u-u


def test_settings_errors_name_the_key():
    with pytest.raises(ConfigError, match="analysis.alhpa: unknown key; did you mean 'analysis.alpha'"):
        AnalysisSettings.from_config({"analysis": {"alhpa": 0.1}})
    with pytest.raises(ValueError, match="analysis.fallback_protocol 'linear' is not among"):
        families(load_config({"protocols": ["knn"]}))
    with pytest.raises(ValueError, match="analysis.protocol 'logreg' is not among"):
        families(load_config({"protocols": ["knn", "linear"], "analysis": ANALYSIS_DEFAULTS | {"protocol": "logreg"}}))


def test_each_job_gets_only_what_its_family_reads():
    config = load_config()
    p = plan(config)
    ctx = AnalysisContext.from_config(config, p.registries, encoders=p.encoders, tasks=p.tasks, datasets=p.datasets)
    cd = ctx.params_for("cd")
    assert set(cd["settings"]) == {"alternative_metrics", "alpha", "linear_protocol", "finetune_protocol"}
    assert "tasks" not in cd
    assert set(next(iter(cd["encoders"].values()))) == {"domain"}
    assert "alpha" not in ctx.params_for("subsets")["settings"]
    restored = AnalysisContext.from_params(ctx.params_for("subsets"))
    with pytest.raises(KeyError, match="'top_k' was not passed to this job"):
        restored.settings["top_k"]
    assert set(FAMILIES) == {"ranks", "rank_figures", "tables", "cd", "protocol_heatmap", "agreement", "distance",
                             "subsets", "leakage", "top_k", "attributes", "ft_lp", "fairness", "sensitivity",
                             "lr_transfer"}
    assert ctx.params_for("attributes") == {"attributes": ctx.attributes, "settings": {}}


def test_each_family_is_one_declared_record():
    """Rule, statistics-and-figure function, inputs and report entries of a family come from its record: the
    stage registry, the plan's report entries and the function called all follow it."""
    from retinabench.analysis import families as family_functions
    from retinabench.analysis.context import Family
    from retinabench.pipeline import STAGES
    rules = [f.rule for f in FAMILIES.values()]
    assert len(set(rules)) == len(rules)
    for name, family in FAMILIES.items():
        assert isinstance(family, Family) and family.name == name
        assert callable(getattr(family_functions, family.function, None)), family.function
        assert family_functions.family_function(name).__name__ == family.function
        assert STAGES.get(family.rule).__name__ == f"stage_{name}"
        keys = [r.key for r in family.report]
        assert len(set(keys)) == len(keys) and all(k.startswith(("png", "ranking", "appendix", "attributes")) for k in keys)


def test_ocularbench_plans_the_papers_figures_and_tables():
    """config/ocularbench.yaml (merged over config/config.yaml as the CLI does) plans Fig. 4, Fig. A.3, Table 1 and
    the OCT top-k panel; its protocol figures show the paper's three protocols, the cached `linear` probe only in the
    extended twins; the groups are the paper's."""
    from retinabench.stats.groups import domain_group
    from tests.conftest import shipped_config
    config = shipped_config("ocularbench")
    ctx = context(config)
    skipped: list = []
    out = analysis_outputs(ctx, "R", skipped)
    assert out["rank_figures"]["png_linear_probe"] == "R/figures/rank_distribution_linear_probe.png"   # Fig. 4
    assert out["cd"]["png_linear_probe"] == "R/figures/cd_diagram_linear_probe.png"                   # Fig. A.3
    assert out["attributes"]["attributes_csv"] == "R/tables/attribute_distribution.csv"                         # Table 1
    assert out["top_k"]["png_oct"] == "R/figures/top_k_oct.png" and out["top_k"]["table_oct"] == "R/analysis/top_k_oct.csv"
    assert ctx.linear_probe == "linear_aug" and ctx.analysis_protocol["protocol"] == "finetune"
    # paper figures: kNN, linear probe (linear_aug), fine-tuning; the cached `linear` probe goes to *_extended
    assert set(ctx.protocol_sets[""]) == {"knn", "linear_aug", "finetune"}
    assert ctx.protocol_sets["_extended"] == ctx.protocols and "linear" in ctx.protocols
    for family, key in (("protocol_heatmap", "png_extended"), ("agreement", "png_protocols_extended"),
                        ("distance", "png_protocols_extended")):
        assert out[family][key].endswith("_extended.png")
    planned = {Path(p).name for fam in out.values() for p in fam.values()}
    assert {"rank_distribution_linear_probe.pdf", "cd_diagram_linear_probe.pdf", "attribute_distribution.tex",
            "top_k_oct.pdf", "srd_protocols_extended.png"} <= planned
    assert not [r for r in skipped if r["output"] in ("rank_distribution_linear_probe", "cd_diagram_linear_probe",
                                                      "attribute_distribution", "top_k_oct")]
    # every OCT task is in the OCT panel's family (not only the ones left after excluding leaked datasets)
    assert sum(m["modality"] == "oct" for m in ctx.tasks.values()) >= 3
    # the paper's groups: "other" holds the untrained and the chest-x-ray encoders
    groups = {e: domain_group(m["domain"]) for e, m in ctx.encoders.items()}
    assert {e for e, g in groups.items() if g == "other"} == {"resnet50_random", "rad_dino"}
    assert {m["method_group"] for m in ctx.encoders.values()} == {"supervised", "self_distillation",
                                                                  "masked_modelling", "image_text", "none"}
