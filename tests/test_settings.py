"""The defaults live once (retinabench.settings); config/config.yaml documents the same values."""
from pathlib import Path

import pytest
import yaml

from retinabench import settings

REPO = Path(__file__).resolve().parents[1]
SECTIONS = {"analysis": settings.analysis_settings, "reliability": settings.reliability_settings,
            "finetune": settings.finetune_settings, "sweep": settings.sweep_settings,
            "saliency": settings.saliency_settings, "compute": settings.compute_settings,
            "lora": settings.lora_settings, "images": settings.images_settings}
# Keys config.yaml sets on purpose to something other than the package default (the default is empty).
CONFIG_ONLY = {("reliability", "harmonised")}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_config_yaml_documents_the_package_defaults(section):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    defaults = SECTIONS[section]({})
    given = config[section]
    differ = {k: (v, defaults.get(k)) for k, v in given.items()
              if (section, k) not in CONFIG_ONLY and SECTIONS[section]({section: {k: v}})[k] != defaults[k]}
    assert not differ, f"config/config.yaml `{section}:` differs from retinabench.settings: {differ}"
    assert config["phantom"] == settings.PHANTOM_DEFAULTS


def test_unknown_keys_name_the_section_and_the_key():
    for section, fn in SECTIONS.items():
        with pytest.raises(KeyError, match=f"{section}: unknown key.*'no_such_key'"):
            fn({section: {"no_such_key": 1}})
