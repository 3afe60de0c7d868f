"""Frozen-feature extraction from the image cache."""
