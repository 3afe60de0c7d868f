"""Protocols: every one writes the predictions schema (see retinabench.schemas.PREDICTIONS)."""
