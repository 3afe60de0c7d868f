"""FOCUS-style logistic probe: scikit-learn logistic regression, class_weight='balanced', standardised input."""
from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler


def logreg_predict_proba(train_x, train_y, query_xs: list[np.ndarray], n_classes: int, *, C: float = 1.0,
                         max_iter: int = 1000, seed: int = 0) -> list[np.ndarray]:
    model = make_pipeline(StandardScaler(), LogisticRegression(C=C, class_weight="balanced", max_iter=max_iter,
                                                                random_state=seed))
    model.fit(train_x, train_y)
    classes = model[-1].classes_
    outs = []
    for q in query_xs:
        p = np.zeros((len(q), n_classes))
        p[:, classes] = model.predict_proba(q)
        outs.append(p)
    return outs


# -- the protocol registry's interface (retinabench.protocols.registry) ------------------------------------------
def fit(train_x, train_y, val_x, val_y, n_classes: int, *, seed: int, balanced: bool, settings: dict):
    """The fitted pipeline (the same model as :func:`logreg_predict_proba`); no training log."""
    model = make_pipeline(StandardScaler(), LogisticRegression(C=settings.get("C", 1.0), class_weight="balanced",
                                                                max_iter=settings.get("max_iter", 1000),
                                                                random_state=seed))
    model.fit(train_x, train_y)
    return (model, n_classes), None


def predict(fitted, x: np.ndarray) -> np.ndarray:
    model, n_classes = fitted
    p = np.zeros((len(x), n_classes))
    p[:, model[-1].classes_] = model.predict_proba(x)
    return p
