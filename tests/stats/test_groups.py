"""The paper's encoder groups (domain groups with "Other", the method-group vocabulary) and Fig. 2's exposure
likelihood, on the project's encoder registries."""
from pathlib import Path

import pandas as pd
import pytest
import yaml

from retinabench.registry import RegistryError, load_registry
from retinabench.stats.distance import group_means, kruskal_by_group
from retinabench.stats.groups import DOMAIN_GROUPS, domain_group, domains, method_group, method_groups, order_by_size
from retinabench.stats.leakage import exposure_assessment, exposure_likelihood

REPO = Path(__file__).resolve().parents[2]
ENCODER_FILES = ("config/encoders.yaml", "config/demo/encoders.yaml", "config/scale/encoders.yaml")


@pytest.fixture(scope="module")
def registry():
    return load_registry(REPO / "config/encoders.yaml", "encoders")


def test_other_holds_the_untrained_and_chest_xray_encoders(registry):
    groups = {e: domain_group(m["domain"]) for e, m in registry.items()}
    other = {e for e, g in groups.items() if g == "other"}
    assert {"resnet50_random", "rad_dino"} <= other
    assert all(registry[e].get("init") == "random" or registry[e]["domain"] in ("radiology", "medical")
               for e in other)
    # retinal encoders of any modality are one group; natural and pathology stay their own
    assert {groups[e] for e in ("retfound_mae_cfp", "retfound_mae_oct", "urfound")} == {"retinal"}
    assert groups["dinov2_vitb14"] == "natural" and groups["virchow"] == "pathology"
    # every domain the schema allows has a group
    assert set(DOMAIN_GROUPS) == set(domains())
    with pytest.raises(KeyError, match="'x'.*pretraining domain 'marine' has no group"):
        domain_group("marine", "encoder 'x'")


def test_groups_are_ordered_by_size():
    groups = pd.Series({"a": "natural", "b": "retinal", "c": "retinal", "d": "other", "e": "retinal",
                        "f": "natural"})
    assert order_by_size(groups) == ["retinal", "natural", "other"]
    values = pd.Series({"a": 1.0, "b": 2.0, "c": 4.0, "d": -1.0, "e": 0.0, "f": 3.0})
    bars = group_means(values, groups)
    assert bars["group"].tolist() == ["retinal", "natural", "other"]  # the paper's bar order
    assert bars["n"].tolist() == [3, 2, 1] and bars["mean"].tolist() == pytest.approx([2.0, 2.0, -1.0])
    assert kruskal_by_group(values, groups)["groups"] == "retinal (n=3); natural (n=2); other (n=1)"


def test_method_groups_are_a_declared_vocabulary(registry):
    assert method_groups() == ("supervised", "self_distillation", "masked_modelling", "image_text",
                               "instruction_tuning", "none")
    # every entry of the three encoder registries has a group (a random one implicitly "none")
    for path in ENCODER_FILES:
        for name, entry in load_registry(REPO / path, "encoders").items():
            assert method_group(entry, name) in method_groups(), (path, name)
    assert method_group(registry["resnet50_random"]) == "none"
    assert {method_group(registry[e]) for e in ("dinov2_vitb14", "virchow", "dinoret")} == {"self_distillation"}
    assert {method_group(registry[e]) for e in ("clip_vitl14_openai", "siglip_so400m_patch14_384", "ret_clip")} \
        == {"image_text"}
    assert method_group(registry["retfound_mae_cfp"]) == "masked_modelling"
    with pytest.raises(KeyError, match="'e': registry entry lacks method_group"):
        method_group({"domain": "natural", "method": "supervised"}, "'e'")


@pytest.mark.parametrize("change, message", [
    ({"method_group": "contrastive"}, "key method_group: 'contrastive' is not one of"),
    ({"init": "random", "method_group": "supervised"}, "method_group"),
])
def test_the_schema_refuses_a_group_outside_the_vocabulary(tmp_path, change, message):
    entry = yaml.safe_load((REPO / "config/encoders.yaml").read_text())["resnet50_in1k" if "init" not in change
                                                                         else "resnet50_random"]
    path = tmp_path / "encoders.yaml"
    path.write_text(yaml.safe_dump({"enc": {**entry, **change}}))
    with pytest.raises(RegistryError, match=message):
        load_registry(path, "encoders")


def test_fig2_colours_each_encoder_by_its_web_scale_exposure_likelihood(registry):
    datasets = load_registry(REPO / "config/datasets.yaml", "datasets")
    benchmark = {d: datasets[d] for d in ("aptos2019", "eyepacs", "idrid", "oct2017", "papila", "brset")}
    assert any(m["web_exposure_risk"] == "high" for m in benchmark.values())
    names = ["dinov2_vitb14", "clip_vitl14_openai", "siglip_so400m_patch14_384", "retfound_mae_cfp", "urfound",
             "retfound_mae_meh", "dinoret", "resnet50_in1k", "vit_base_patch16_in21k", "resnet50_random",
             "rad_dino", "virchow"]
    level = exposure_likelihood({n: registry[n] for n in names}, benchmark)
    # web-scale natural-image and CLIP-like encoders: likely; recorded exposure: known; a public ophthalmic
    # collection: possible; curated / institutional data or no pretraining: unlikely
    assert {n for n in names if level[n] == "likely"} == {"dinov2_vitb14", "clip_vitl14_openai",
                                                          "siglip_so400m_patch14_384"}
    assert {n for n in names if level[n] == "known"} == {"retfound_mae_cfp", "urfound"}
    assert level["dinoret"] == "possible"
    assert {level[n] for n in ("retfound_mae_meh", "resnet50_in1k", "vit_base_patch16_in21k", "resnet50_random",
                               "rad_dino", "virchow")} == {"unlikely"}
    basis = exposure_assessment({n: registry[n] for n in names}, benchmark)
    assert basis["clip_vitl14_openai"] == ("likely", "web-scale pretraining: wit-400m")
    assert basis["retfound_mae_cfp"] == ("known", "exposure: eyepacs")
    assert basis["resnet50_random"] == ("unlikely", "no pretraining")
    # a benchmark of request-access datasets only cannot have been crawled from the web
    low = {d: m for d, m in datasets.items() if m.get("web_exposure_risk") == "low"}
    assert exposure_likelihood({"dinov2_vitb14": registry["dinov2_vitb14"]}, low) == {"dinov2_vitb14": "unlikely"}
