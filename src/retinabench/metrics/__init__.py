"""Metrics computed from the predictions schema with scikit-learn."""
