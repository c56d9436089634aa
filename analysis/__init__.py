"""Analysis of a sweep's `results.parquet`: model selection, the paper's tables, figures.

Reads result files only; imports pandas, numpy, pyarrow and matplotlib (Agg canvas), never
torch or ray.

Entry points
------------
- ``build_all(results_dir, rules=None, figures=True) -> list[Path]``: reads
  ``results_dir/results.parquet`` and writes ``table.md``, ``table.parquet``, ``table.tex``
  and ``figures/*.png``; returns the written paths and prints nothing. The sweep drivers call
  it at the end of a sweep.
- ``python -m analysis DIR``: the same from the shell, one ``wrote PATH`` line per file. A
  missing ``results.parquet`` or a broken contract prints ``error: <one line>`` to stderr and
  exits 2 (e.g. ``results.parquet: column 'lam' is missing``,
  ``results.parquet: column 'epoch' has dtype object, expected integer``).
- ``load_results(dir)``, ``final_rows(df)``, ``per_lambda(finals)``, ``spearman(x, y)``;
  ``ResultsError(ValueError)``; ``analysis.io.atomic_write_{bytes,text,parquet}``,
  ``atomic_savefig`` (temp file in the same directory, then ``os.replace``).

Which trials count and which row of each (`analysis.results`), the selection rules
(`analysis.selection`; docs/DESIGN.md), the tables (`analysis.tables`) and the figures
(`analysis.figures`) are described in their modules.
"""

from __future__ import annotations

from unbiased.benchmarks import exit_on_bad_registry

exit_on_bad_registry()  # before the modules that read the registry as they import

from analysis.build import build_all  # noqa: E402
from analysis.results import ResultsError, final_rows, load_results, per_lambda, spearman  # noqa: E402, I001
from analysis.selection import (  # noqa: E402
    Choice,
    HighestFittingLambda,
    LowestMI,
    OracleTest,
    SelectionRule,
    default_rules,
)

__all__ = ["Choice", "HighestFittingLambda", "LowestMI", "OracleTest", "ResultsError",
           "SelectionRule", "build_all", "default_rules", "final_rows", "load_results",
           "per_lambda", "spearman"]
