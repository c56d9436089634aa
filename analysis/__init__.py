"""Analysis of a sweep's `results.parquet`: model selection, the paper's tables, figures.
Reads result files only; imports pandas, numpy, pyarrow and matplotlib (Agg canvas), never
torch or ray.

`build_all(DIR)` writes DIR's table.md, table.parquet, table.tex and figures/*.png (the sweep
drivers call it at a sweep's end); `python -m analysis DIR` does the same from the shell, and
on a missing results.parquet or a broken contract prints one `error:` line and exits 2.
"""

from __future__ import annotations

from unbiased.benchmarks import exit_on_bad_registry

exit_on_bad_registry()  # before the modules that read the registry as they import

from analysis.build import build_all  # noqa: E402

__all__ = ["build_all"]
