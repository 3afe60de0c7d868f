"""Logistic probe: scikit-learn logistic regression (L2 penalty, lbfgs, class_weight='balanced') on frozen features,
in two named variants (``logreg.variant``):

* ``ours`` (the default): features standardised (StandardScaler), ``max_iter`` 2000;
* ``focus`` (FOCUS's, to reproduce it): features L2-normalised row by row (Normalizer; FOCUS's encoders return
  unit-norm embeddings), no scaler, ``max_iter`` 1000 — FOCUS's ``LogisticRegression(max_iter=1000,
  class_weight='balanced')`` (retina_bench/vlms/evaluate.py and cv/evaluate.py, ``linear_probing_eval``),
  scikit-learn's defaults otherwise (C 1.0, L2 penalty, lbfgs).

Both: the L2 penalty (``l1_ratio=0``, scikit-learn >= 1.8's spelling of ``penalty='l2'``), lbfgs, class_weight
'balanced', multinomial for more than two classes (scikit-learn's lbfgs).

``logreg.max_iter: auto`` resolves to the variant's iterations (retinabench.settings.protocols.LOGREG_MAX_ITER, the
one place they are stated)."""
from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

from retinabench.settings.protocols import LogregSettings


def make_model(settings: LogregSettings, seed: int) -> Pipeline:
    """The unfitted pipeline of ``settings.variant``: its feature transform, then the class-balanced logistic
    regression with the section's C and resolved max_iter."""
    transform = Normalizer(norm="l2") if settings.variant == "focus" else StandardScaler()
    return make_pipeline(transform, LogisticRegression(C=settings.C, l1_ratio=0.0, solver="lbfgs",
                                                       class_weight="balanced", max_iter=settings.iterations,
                                                       random_state=seed))


# -- the protocol registry's interface (retinabench.protocols.registry) ------------------------------------------
def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: LogregSettings):
    """The ``logreg:`` section's variant fitted on the training features; no training log."""
    model = make_model(settings, seed)
    model.fit(train_x, train_y)
    return (model, n_classes), None


def predict(fitted, x: np.ndarray) -> np.ndarray:
    model, n_classes = fitted
    p = np.zeros((len(x), n_classes))
    p[:, model[-1].classes_] = model.predict_proba(x)
    return p
