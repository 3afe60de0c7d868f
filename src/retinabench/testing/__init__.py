"""Test and demo helpers that ship with the package (the demo needs them outside pytest)."""
