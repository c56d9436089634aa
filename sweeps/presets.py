"""Preset registry: every default of every sweep, one entry per (driver, preset).

A benchmark's own presets live in its spec module (unbiased/benchmarks/, read through the
registry); re-exported here under the names the drivers and tests import. The ablations and
the lambda search are digits grids with presets of their own, derived from digits' below.

A flag on the command line overrides one value; nothing else in the drivers hard-codes a
hyper-parameter.
"""

from __future__ import annotations

from unbiased.benchmarks import benchmark_spec

DIGITS = benchmark_spec("digits").presets
GERMAN = benchmark_spec("german").presets
IMDB = benchmark_spec("imdb").presets

# The supplementary's K ablation (sweeps/k_ablation.py): K in {20, 40, 80} x sigma x seeds at
# lam = 1, everything else as the digits grid of the same name.
K_ABLATION: dict[str, dict[str, object]] = {
    # One sigma, one seed, 3 trials on the embedded data (minutes on 2 cores).
    "quick": {**DIGITS["quick"], "sigma": [0.03], "lam": [1.0], "K": [20, 40, 80],
              "seeds": [0]},
    # The supplementary's figure at full scale on the cpu protocol: lam 1 at sigma .020, the
    # paper's K values, seeds 0-2 (9 trials, a seed's three K side by side in grid order).
    "cpu": {**DIGITS["cpu"], "sigma": [0.02], "lam": [1.0], "K": [20, 40, 80],
            "seeds": [0, 1, 2]},
    # 7 sigmas x 3 K x 3 seeds = 63 trials at the paper's settings.
    "paper": {**DIGITS["paper"], "lam": [1.0], "K": [20, 40, 80]},
}

# What our two critic options add to the paper's method (sweeps/critic_ablation.py): lam 1
# with the four critics {paper's, standardised input only, MI guard only, both} as grid axes
# (mine_standardize x mi_guard), everything else as the digits grid of the same name.
CRITIC_ABLATION: dict[str, dict[str, object]] = {
    "quick": {**DIGITS["quick"], "sigma": [0.03], "lam": [1.0], "seeds": [0],
              "mine_standardize": [False, True], "mi_guard": [False, True]},
    # lam 1 at sigma .020 and .030 x seeds 0-2 x 4 critics = 24 trials on the cpu protocol.
    "cpu": {**DIGITS["cpu"], "sigma": [0.02, 0.03], "lam": [1.0], "seeds": [0, 1, 2],
            "mine_standardize": [False, True], "mi_guard": [False, True]},
}

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
