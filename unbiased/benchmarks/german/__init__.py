"""UCI German credit (Table 3): spec.py (presets, flags, table) and data.py (the data)."""
