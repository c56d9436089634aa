"""Biased MNIST (ReBias): spec.py (presets, flags, table) and data.py (the data)."""
