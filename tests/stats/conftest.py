import pandas as pd
import pytest


def _ranks_from(scores: dict[str, dict[str, float]], *, protocol="linear", regime="u-u", metric="accuracy"):
    from retinabench.schemas import METRICS
    from retinabench.stats.ranks import rank_table
    rows = [{"dataset": "ds", "task": t, "encoder": e, "protocol": protocol, "seed": 0, "regime": regime,
             "split": "test", "metric": metric, "value": v, "n": 10}
            for t, per_enc in scores.items() for e, v in per_enc.items()]
    return rank_table(pd.DataFrame(rows)[METRICS.names], metric=metric)


@pytest.fixture
def ranks_from():
    """``ranks_from({task: {encoder: score}}, protocol=, regime=, metric=)``: a rank table (higher score first)."""
    return _ranks_from
