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
