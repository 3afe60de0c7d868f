"""The protocol registry: one entry per protocol (duplicates refused), the config schema's protocol enums and the
config's protocol sections come from it; the nearest-centroid probe added through it runs in the frozen job."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from retinabench.protocols.centroid import fit, predict
from retinabench.protocols.frozen import run_frozen
from retinabench.protocols.registry import PROTOCOLS, Protocol, ProtocolRegistry, frozen_protocols
from retinabench.settings import CentroidSettings

REPO = Path(__file__).resolve().parents[2]
TASK = {"name": "t", "dataset": "d", "classes": ["a", "b", "c"], "ordinal": False}


def test_duplicates_and_unknown_kinds_are_refused():
    reg = ProtocolRegistry()
    reg.register(Protocol("zeroshot", "prompts", "m:run", family=("zeroshot", "zeroshot_focus")))
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(Protocol("zeroshot_focus", "prompts", "m:run"))
    with pytest.raises(ValueError, match="kind 'text' is not one of"):
        Protocol("x", "text", "m")
    with pytest.raises(ValueError, match="unknown features protocol\\(s\\) \\['zeroshot'\\]"):
        reg.check(["zeroshot"], "features", "protocols")


def test_a_protocols_settings_are_its_sections_model():
    from retinabench.settings import ConfigError, MLLMSection
    spec = PROTOCOLS.get("mllm")
    typed = spec.settings({"mllm": {"batch_size": "4"}})  # --config gives strings: coerced by the model
    assert isinstance(typed, MLLMSection) and typed.batch_size == 4 and typed.max_new_tokens == 8
    assert PROTOCOLS.get("knn").settings({}).k == 20  # the one default, on the model
    with pytest.raises(ConfigError, match="centroid.k: unknown key"):
        PROTOCOLS.get("centroid").settings({"centroid": {"k": 3}})
    with pytest.raises(KeyError, match="no config section 'nosuch'"):
        Protocol("x", "features", "m", section="nosuch")
    assert Protocol("x", "prompts", "retinabench.protocols.centroid:predict").job() is predict


def test_schema_enums_and_config_sections_come_from_the_registry():
    import typing

    from retinabench.settings.base import FeatureProtocol
    assert list(typing.get_args(FeatureProtocol)) == frozen_protocols()
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["protocols"]["items"]["enum"] == frozen_protocols()
    transfer = schema["$defs"]["TransferSettings"]["properties"]["protocols"]
    assert transfer["items"]["enum"] == frozen_protocols()
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for name in frozen_protocols():
        spec = PROTOCOLS.get(name)
        assert config[spec.section] == spec.settings({}).plain(), f"config/config.yaml `{spec.section}:` is not " \
                                                                  "the default"
        module = spec.code()
        assert callable(module.fit) and callable(module.predict)


def blobs(n=240, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    x = rng.normal(size=(n, dim)) * 0.5 + 2.0 * np.eye(dim)[y]
    return x, y


def test_centroid_probe_by_hand_and_imbalance_free():
    x = np.array([[2.0, 0.0], [1.0, 0.0], [0.0, 3.0]])
    model, log = fit(x, np.array([0, 0, 1]), None, None, 2, seed=0, balanced=False, settings=CentroidSettings(temperature=0.5))
    assert log is None
    np.testing.assert_allclose(model["prototypes"], [[1.0, 0.0], [0.0, 1.0]])
    p = predict(model, np.array([[1.0, 1.0]]))  # equidistant -> 1/2 each; on the axis: softmax((1 - 0) / 0.5)
    np.testing.assert_allclose(p, [[0.5, 0.5]])
    np.testing.assert_allclose(predict(model, np.array([[1.0, 0.0]]))[0, 0], 1 / (1 + np.exp(-2.0)))
    # repeating one class's images leaves the prototypes unchanged (no class prior)
    more, _ = fit(np.vstack([x, x[:2]]), np.array([0, 0, 1, 0, 0]), None, None, 2, seed=0, balanced=False,
                  settings=CentroidSettings())
    np.testing.assert_allclose(more["prototypes"], model["prototypes"])
    with pytest.raises(ValueError, match="classes \\[2\\] have no training images"):
        fit(x, np.array([0, 0, 1]), None, None, 3, seed=0, balanced=False, settings=CentroidSettings())


def test_centroid_runs_through_the_frozen_job_once_per_regime():
    x, y = blobs()
    ids = pd.Index([f"i{k}" for k in range(len(y))])
    part = np.array(["train"] * 160 + ["val"] * 40 + ["test"] * 40)
    split = pd.DataFrame({"image_id": ids, "y": y, "split": part, "balanced": True})
    preds, log = run_frozen(ids, x.astype(np.float32), split, TASK, "enc", protocols=["centroid", "knn"],
                            seeds=[0, 1], regimes=["u-u", "b-b"], cfg={"centroid": {"temperature": 0.07},
                                                                        "knn": {"k": 5, "temperature": 0.07}})
    cen = preds[preds["protocol"] == "centroid"]
    assert set(cen["seed"]) == {0} and set(cen["regime"]) == {"u-u", "b-b"}
    test = cen[(cen["split"] == "test") & (cen["regime"] == "u-u")]
    assert (test["y_true"] == test["y_pred"]).mean() > 0.9
    np.testing.assert_allclose(test[["p_a", "p_b", "p_c"]].sum(axis=1), 1.0)
    assert log.empty  # neither protocol trains
