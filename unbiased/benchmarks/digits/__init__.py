"""Colored MNIST (the paper's Table 1): spec.py (presets, flags, table) and data.py (the data)."""
