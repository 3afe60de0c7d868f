"""FOCUS-style logistic probe: scikit-learn logistic regression, class_weight='balanced', standardised input."""
from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from retinabench.settings.protocols import LogregSettings


# -- the protocol registry's interface (retinabench.protocols.registry) ------------------------------------------
def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: LogregSettings):
    """Standardisation + class-balanced logistic regression with the ``logreg:`` section's C and max_iter; no
    training log."""
    model = make_pipeline(StandardScaler(), LogisticRegression(C=settings.C, class_weight="balanced",
                                                                max_iter=settings.max_iter, random_state=seed))
    model.fit(train_x, train_y)
    return (model, n_classes), None


def predict(fitted, x: np.ndarray) -> np.ndarray:
    model, n_classes = fitted
    p = np.zeros((len(x), n_classes))
    p[:, model[-1].classes_] = model.predict_proba(x)
    return p
