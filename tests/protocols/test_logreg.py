"""The logistic probe's two named variants: ours (standardised features, max_iter 2000) and FOCUS's (L2-normalised
features, no scaler, max_iter 1000: FOCUS's LogisticRegression(max_iter=1000, class_weight='balanced'))."""
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import Normalizer, StandardScaler

from retinabench.protocols import logreg
from retinabench.protocols.registry import PROTOCOLS
from retinabench.settings import ConfigError
from retinabench.settings.protocols import LogregSettings


def _data(n=120, d=6, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, d)) + y[:, None] * np.linspace(0.2, 1.2, d)
    x[:, 0] *= 50.0  # one feature on another scale: standardising and L2-normalising then disagree
    return x, y


def _fit(variant, x, y, **kw):
    s = PROTOCOLS.get("logreg").settings({"logreg": {"variant": variant, **kw}})
    return logreg.fit(x, y, None, None, 2, seed=0, balanced=True, settings=s)[0], s


def test_focus_variant_is_l2_normalised_input_without_a_scaler_and_1000_iterations():
    x, y = _data()
    (model, _), s = _fit("focus", x, y)
    assert s.iterations == 1000 and model[-1].max_iter == 1000
    assert isinstance(model[0], Normalizer) and not any(isinstance(step, StandardScaler) for step in model)
    clf = model[-1]
    assert clf.class_weight == "balanced" and clf.C == 1.0 and clf.l1_ratio == 0.0 and clf.solver == "lbfgs"
    z = model[0].transform(x)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-12)  # unit-norm rows reach the classifier
    # = FOCUS's code on its (unit-norm) embeddings
    focus = LogisticRegression(max_iter=1000, class_weight="balanced").fit(x / np.linalg.norm(x, axis=1,
                                                                                              keepdims=True), y)
    np.testing.assert_allclose(logreg.predict((model, 2), x),
                               focus.predict_proba(x / np.linalg.norm(x, axis=1, keepdims=True)), atol=1e-6)
    # a row's scale does not matter to FOCUS's probe; it does to ours
    scaled = x * np.random.default_rng(1).uniform(0.1, 10.0, size=(len(x), 1))
    np.testing.assert_allclose(logreg.predict((model, 2), scaled), logreg.predict((model, 2), x), atol=1e-12)
    (ours, _), _ = _fit("ours", x, y)
    assert not np.allclose(logreg.predict((ours, 2), scaled), logreg.predict((ours, 2), x), atol=1e-3)


def test_ours_is_the_default_standardised_with_2000_iterations():
    x, y = _data()
    (model, _), s = _fit("ours", x, y)
    assert LogregSettings().variant == "ours" and s.iterations == 2000 and model[-1].max_iter == 2000
    assert isinstance(model[0], StandardScaler)
    (focus, _), _ = _fit("focus", x, y)
    assert not np.allclose(logreg.predict((model, 2), x), logreg.predict((focus, 2), x), atol=1e-3)


def test_an_explicit_max_iter_overrides_the_variants_and_a_bad_variant_is_refused():
    x, y = _data()
    (model, _), s = _fit("focus", x, y, max_iter=300)
    assert s.iterations == 300 and model[-1].max_iter == 300
    with pytest.raises(ConfigError, match="variant"):
        PROTOCOLS.get("logreg").settings({"logreg": {"variant": "sklearn"}})
