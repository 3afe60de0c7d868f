"""Coverage rows: adapter exclusions per task, unsupported harmonised tasks, missing transfer partners."""
from pathlib import Path

import pandas as pd
import pytest
import yaml

from retinabench.metrics.coverage import Coverage, label_exclusions
from retinabench.reliability import harmonised_coverage
from retinabench.settings import ReliabilitySettings

REPO_CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"


def test_label_exclusions_keep_the_task_modality_only():
    manifest = pd.DataFrame({"image_id": ["c1", "c2", "o1"], "modality": ["cfp", "cfp", "oct"]})
    excl = pd.DataFrame([
        {"image_id": "c1", "scope": "label:dr3", "reason": "DR grade '-' (unknown)"},
        {"image_id": "c2", "scope": "label:dr3", "reason": "DR grade '-' (unknown)"},
        {"image_id": "o1", "scope": "label:dr3", "reason": "DR grade empty"},
        {"image_id": "c1", "scope": "label:dme", "reason": "x"},
        {"image_id": "zz", "scope": "image", "reason": "image file not found"},
        {"image_id": "c2", "scope": "normalised", "reason": "lower-case eye"},
    ])
    task = {"label": "dr3", "modality": "cfp"}
    assert label_exclusions(excl, manifest, task) == [("labels", "dr3: DR grade '-' (unknown)", 2),
                                                     ("images", "dataset-level: image file not found", 1)]
    with pytest.raises(KeyError, match="lacks columns"):
        label_exclusions(excl.drop(columns="reason"), manifest, task)


def test_coverage_rows_are_checked_and_deduplicated():
    cov = Coverage()
    keys = {"source": "frozen", "encoder": "e", "protocol": "linear", "dataset": "d", "task": "t", "regime": "u-u"}
    cov.add(keys, "test", "evaluated", 10)
    cov.add({**keys, "seed": 1}, "test", "evaluated", 10)  # another seed, same record
    assert len(cov.frame()) == 1
    with pytest.raises(ValueError, match="status"):
        cov.add(keys, "test", "dropped", 1)
    with pytest.raises(KeyError, match="lacks keys"):
        cov.add({"source": "frozen"}, "test", "evaluated", 1)


def test_config_records_unsupported_harmonised_tasks_for_tvhl_and_phantom(registries):
    settings = ReliabilitySettings.from_config(yaml.safe_load(REPO_CONFIG.read_text()))
    for datasets in (["tvhl"], ["phantom", "phantom_siteb"]):
        tasks = {n: t for n, t in registries.tasks.items() if t["dataset"] in datasets}
        cov = harmonised_coverage(settings, datasets, tasks)
        unsupported = cov[cov["status"] == "not_supported"]
        assert set(unsupported.loc[unsupported["task"] == "referable_dr", "dataset"]) == set(datasets)
        assert (unsupported["reason"].str.len() > 10).all()
        assert not (unsupported["reason"] == "no task entry in the task registry").any()
    tvhl = {n: t for n, t in registries.tasks.items() if t["dataset"] == "tvhl"}
    cov = harmonised_coverage(settings, ["tvhl"], tvhl)
    assert cov.loc[(cov["task"] == "gon"), "reason"].item() == "no glaucoma labels"
    transfer = cov[cov["scope"] == "transfer"]
    assert set(transfer["task"]) == {"tvhl_cfp_anydr", "tvhl_oct_anydr"}  # no second dataset with any DR
