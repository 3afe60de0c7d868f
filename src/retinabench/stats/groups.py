"""Encoder groups of the Kruskal–Wallis tests and the signed-rank-distance bars, as OcularBench groups them.

* **Pretraining-domain groups** (:data:`DOMAIN_GROUPS`, from the registry's ``domain``): natural images, retinal
  images (CFP, OCT or both), pathology, and **other** — the untrained (randomly initialised) encoders together with
  the chest-x-ray one (and any other medical domain), the paper's "Other" group. Singleton groups (one radiology
  encoder, one random one) would leave the test with groups of one.
* **Pretraining-method groups** (registry ``method_group``, its vocabulary the encoder schema's enum,
  ``schemas_json/encoders.schema.json``): the free-text ``method`` stays descriptive; an entry with
  ``init: random`` is in group ``none`` without saying so.

Bars and Kruskal–Wallis listings order groups by size, largest first (ties by name): :func:`order_by_size`.
"""
from __future__ import annotations

import json
from functools import cache
from importlib import resources

import pandas as pd

# registry `domain` -> the paper's pretraining-domain group (every value of the schema's domain enum: a test pins it)
DOMAIN_GROUPS = {
    "natural": "natural", "cfp": "retinal", "oct": "retinal", "cfp+oct": "retinal", "pathology": "pathology",
    "radiology": "other", "medical": "other", "none": "other",
}
GROUP_FIELDS = ("domain_group", "method_group")   # the groupings the distance tables carry and test


@cache
def _encoder_schema() -> dict:
    return json.loads(resources.files("retinabench").joinpath("schemas_json", "encoders.schema.json").read_text())


def method_groups() -> tuple[str, ...]:
    """The method-group vocabulary: the encoder schema's ``method_group`` enum (its one home)."""
    return tuple(_encoder_schema()["properties"]["method_group"]["enum"])


def domains() -> tuple[str, ...]:
    """The registry's pretraining domains: the encoder schema's ``domain`` enum."""
    return tuple(_encoder_schema()["properties"]["domain"]["enum"])


def domain_group(domain: str | None, where: str = "encoder") -> str:
    """The paper's pretraining-domain group of a registry ``domain`` (``where`` names the entry in errors)."""
    if domain not in DOMAIN_GROUPS:
        raise KeyError(f"{where}: pretraining domain {domain!r} has no group; known domains: "
                       f"{sorted(DOMAIN_GROUPS)} (retinabench.stats.groups.DOMAIN_GROUPS)")
    return DOMAIN_GROUPS[domain]


def method_group(entry: dict, where: str = "encoder") -> str:
    """An encoder's method group: its registry ``method_group``; ``none`` for ``init: random``."""
    group = entry.get("method_group")
    if group is None and entry.get("init") == "random":
        group = "none"
    if group is None:
        raise KeyError(f"{where}: registry entry lacks method_group (one of {', '.join(method_groups())}; "
                       "needed to group encoders by pretraining method)")
    if group not in method_groups():
        raise ValueError(f"{where}: method_group {group!r} is not one of {', '.join(method_groups())}")
    return str(group)


def order_by_size(groups: pd.Series) -> list[str]:
    """Group names ordered by member count, largest first (ties: by name) — the paper's bar order."""
    counts = groups.value_counts()
    return sorted(counts.index, key=lambda g: (-int(counts[g]), str(g)))
