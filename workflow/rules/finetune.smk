# Fine-tuning stage: full fine-tuning, augmented linear probing and the two-stage learning-rate sweep.


def finetune_metrics_files():
    """Per-job metrics tables of the fine-tuning protocols this config runs."""
    return []
