"""Figures (matplotlib, PNG + PDF); colours by pretraining domain, used consistently."""
