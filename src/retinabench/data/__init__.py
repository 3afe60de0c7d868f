"""Data layer: adapters (raw layout -> manifest + exclusions), splits, image cache, phantom generator."""
