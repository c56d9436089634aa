"""IMDB faces (Table 2): spec.py (presets, flags, table) and data.py (the data)."""
