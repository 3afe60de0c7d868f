"""retinabench: a reproducible benchmark of pretrained vision encoders on ophthalmic image classification."""

__version__ = "0.1.0"
