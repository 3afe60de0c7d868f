"""Encoders: one loader per source library, entries from config/encoders.yaml."""
from retinabench.models.loaders import Encoder, build_encoder, weights_record

__all__ = ["Encoder", "build_encoder", "weights_record"]
