"""Analysis of a sweep's `results.parquet`: model selection, the paper's tables, figures.

Reads result files only; imports pandas, numpy, pyarrow and matplotlib (Agg canvas), never
torch or ray.

Entry points
------------
- ``build_all(results_dir, rules=None, figures=True) -> list[Path]``: reads
  ``results_dir/results.parquet`` and writes ``table.md``, ``table.parquet`` and
  ``figures/*.png``; returns the written paths and prints nothing. The sweep drivers call it at
  the end of a sweep.
- ``python -m analysis DIR``: the same from the shell, one ``wrote PATH`` line per file. A
  missing ``results.parquet`` or a broken contract prints ``error: <one line>`` to stderr and
  exits 2 (e.g. ``results.parquet: column 'lam' is missing``,
  ``results.parquet: column 'epoch' has dtype object, expected integer``).
- ``load_results(dir)``, ``final_rows(df)``, ``per_lambda(finals)``, ``spearman(x, y)``;
  ``ResultsError(ValueError)``; ``analysis.io.atomic_write_{bytes,text,parquet}``,
  ``atomic_savefig`` (temp file in the same directory, then ``os.replace``).

Trials and final rows
---------------------
A trial's final row is its row with the largest ``epoch``. A trial is excluded (diverged or
failed) when its ``status`` starts with "diverged" or "error", or its final ``train_acc``,
``mi`` or ``loss_task`` is NaN/inf (``mi``/``loss_task`` only for MI methods). Excluded trials
are listed in ``table.md`` and never averaged, plotted or chosen.

Selection rules (``analysis.selection``)
----------------------------------------
Each rule is a class with ``name`` and ``choose(finals) -> Choice(lam, rule, reason)``, applied
to the final rows of one group (benchmark, K, method, and each data axis its benchmark's spec
declares: digits' sigma, IMDB's train_split). Seeds
are averaged per lambda first; a lambda with no kept trial is not a candidate.

- ``LowestMI(tolerance=0.05)``, "lowest-MI (label-free)": among lambdas whose mean train
  accuracy is within ``tolerance`` (absolute) of the best lambda's, the lowest MI, using
  ``mi_eval`` (MI measured by a fresh statistics network) when every candidate has it, else the
  training-time ``mi``; ties within 1e-9 go to the higher lambda.
- ``HighestFittingLambda(tolerance=0.05)``, "highest-fitting-λ (label-free)": the paper's
  wording, the highest lambda that still fits the training data (same tolerance) and lowers MI
  below lambda=0's; falls back to lambda=0 (with the reason) when none does.
- ``OracleTest()``, "oracle (peeks at test labels)": best mean test accuracy. A reference for
  the gap of the label-free rules, not a selection method.

Tables (``table.md`` / ``table.parquet``)
-----------------------------------------
Cells are each trial's reported epoch (the one a label-free stopping rule picked where the
rows mark one, `selected`; else the last), mean ± std over seeds (pandas default std,
ddof=1) with n. Per benchmark present: the paper's table (digits: Table 1, columns = sigma;
German: Table 3, Acc. and EO; IMDB: Table 2, EB1→EB2, EB1→Test, EB2→EB1, EB2→Test), one
block per K, with our rows (λ=0, the paper's λ, one row per rule showing the chosen λ) and
the paper's numbers labelled "(published)"; then per group the per-λ final metrics, each
rule's choice with its gap to the oracle and reason, and the Spearman correlation between
final MI and test accuracy across lambdas (NaN with a note for fewer than 3).
``table.parquet`` is the tidy form: benchmark, block, row, column, mean, std, n, source
("ours"/"published"), rule, lam.

Figures (``figures/``)
----------------------
``<benchmark>_K<K>_curves.png``: the paper's Fig. 3, one row per sigma (digits) / train split
(IMDB) / one row (German); MI, test and train accuracy vs epoch, one line per lambda (mean over
seeds, shaded min-max). ``<benchmark>_K_ablation.png`` when several K are present: final test
accuracy and MI vs K, one line per sigma, one row per lambda.
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

__all__ = [
    "Choice",
    "HighestFittingLambda",
    "LowestMI",
    "OracleTest",
    "ResultsError",
    "SelectionRule",
    "build_all",
    "default_rules",
    "final_rows",
    "load_results",
    "per_lambda",
    "spearman",
]
