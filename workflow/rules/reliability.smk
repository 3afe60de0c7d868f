# Reliability stage: calibration, thresholds, fairness and quality gaps, transfer, paired bootstrap.


def reliability_targets():
    """Reliability outputs requested by `all`."""
    return []
