"""Preset registry: every default of every sweep, one entry per (driver, preset).

A benchmark's own presets live in its spec module (unbiased/benchmarks/, read through the
registry); re-exported here under the names the drivers and tests import. The ablations are
presets of digits (`python -m sweeps digits --preset k_ablation_cpu`); the lambda search is a
digits search with presets of its own, derived from digits' below.

A flag on the command line overrides one value; nothing else in the drivers hard-codes a
hyper-parameter.
"""

from __future__ import annotations

from unbiased.benchmarks import benchmark_spec

DIGITS = benchmark_spec("digits").presets
GERMAN = benchmark_spec("german").presets
IMDB = benchmark_spec("imdb").presets

# Optuna lambda search (sweeps/lambda_search.py): one multi-objective study (low mi_eval,
# high train_acc) per (sigma, seed); lambda log-uniform in lam_range, K chosen from the list.
_SEARCH = {"K": [20, 40, 80], "lam_range": [0.01, 10.0]}
LAMBDA_SEARCH: dict[str, dict[str, object]] = {
    # 6 trials at one sigma on the embedded data (minutes on 2 cores).
    "quick": {**{k: v for k, v in DIGITS["quick"].items() if k != "lam"}, **_SEARCH,
              "sigma": [0.03], "seeds": [0], "samples": 6},
    # 16 trials per paper sigma, one seed: 112 trials at the paper's settings.
    "paper": {**{k: v for k, v in DIGITS["paper"].items() if k != "lam"}, **_SEARCH,
              "seeds": [0], "samples": 16},
}
