"""Optuna lambda search on Colored MNIST: lambda (log scale) and K per sigma, label-free objectives.

One multi-objective TPE study per (method, sigma, seed): minimise `mi_eval` (a fresh critic's
MI of the final features) and maximise `train_acc`, neither reading test labels. Writes what
the grid drivers write, plus OUT/pareto.parquet and OUT/pareto.md: each study's Pareto front
with the trial the lowest-MI rule picks on it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from analysis.pareto import pareto_front, write_front
from analysis.results import final_rows
from sweeps import trackers
from sweeps.cli import SweepArgs, build_parser, resolve
from sweeps.common import SweepError, fail
from sweeps.core import (
    benchmark_grid,
    finish,
    has_key,
    nothing_to_resume,
    start,
    start_ray,
    trial_errors,
)
from sweeps.finished_trials import point_records
from sweeps.outputs import storage_dir
from sweeps.results_frame import results_frame
from sweeps.runner import run_tuner
from trainables.record import RecordStore
from unbiased.benchmarks.digits.spec import DIGITS
from unbiased.settings import POINT_KEY

EXPERIMENT = "lambda_search"
# The digits grid's settings, data and trainable; sampled instead of gridded.
GRID = benchmark_grid("digits")
_SEARCH = {"K": [20, 40, 80], "lam_range": [0.01, 10.0]}
LAMBDA_SEARCH: dict[str, dict[str, object]] = {  # digits' presets, lambda and K sampled
    # 6 trials at one sigma on the embedded data (minutes on 2 cores).
    "quick": {**{k: v for k, v in DIGITS["quick"].items() if k != "lam"}, **_SEARCH,
              "sigma": [0.03], "seeds": [0], "samples": 6},
    # 16 trials per paper sigma, one seed: 112 trials at the paper's settings.
    "paper": {**{k: v for k, v in DIGITS["paper"].items() if k != "lam"}, **_SEARCH,
              "seeds": [0], "samples": 16},
}
OBJECTIVES = ["mi_eval", "train_acc"]
MODES = ["min", "max"]


def search_space(values: dict, sigma: float, seed: int, method: str) -> dict:
    """One study's space, under the trial's point (so a resumed study finds its records)."""
    from ray import tune

    low, high = (float(v) for v in values["lam_range"])
    point: dict = {"method": method, "sigma": float(sigma), "seed": int(seed),
                   "lam": tune.loguniform(low, high)}
    if has_key(method, "K"):
        point["K"] = tune.choice([int(k) for k in values["K"]])
    return {**GRID.fixed_values(values),
            "num_threads": max(1, int(float(values["cpus_per_trial"]))), POINT_KEY: point}


def make_searcher(samples: int, seed: int, space: dict, records: RecordStore):
    """Multi-objective TPE: the first third of the trials random, and at most that many at
    once, so later proposals use the finished ones. A resumed study's finished `records`
    come first, the unfinished are proposed again; returns the searcher and how many ended."""
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    startup = max(2, samples // 3)
    sampler = optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage,
                                directions=["minimize" if m == "min" else "maximize"
                                            for m in MODES], sampler=sampler)
    again, done = [], 0
    for record in records.read_all().values():
        params = {f"{POINT_KEY}/{k}": v for k, v in record.config.items()
                  if k in space[POINT_KEY] and not isinstance(space[POINT_KEY][k], str | int
                                                               | float)}
        rows = record.metrics()
        if record.ended is not None and rows and all(k in rows[-1] for k in OBJECTIVES):
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions=_distributions(space, params),
                values=[float(rows[-1][k]) for k in OBJECTIVES]))
            done += 1
        else:
            again.append(params)
    # metric/mode go to the searcher, not to TuneConfig (Tune's multi-objective convention).
    search = OptunaSearch(metric=OBJECTIVES, mode=MODES, sampler=sampler,
                          storage=storage, study_name=study.study_name,
                          points_to_evaluate=again or None)
    return ConcurrencyLimiter(search, max_concurrent=startup), done


def _distributions(space: dict, params: dict) -> dict:
    """The Optuna distributions Tune's OptunaSearch makes of the space's sampled values."""
    import optuna

    out = {}
    for name in params:
        domain = space[POINT_KEY][name.split("/", 1)[1]]
        categories = getattr(domain, "categories", None)
        out[name] = (optuna.distributions.CategoricalDistribution(categories)
                     if categories is not None else optuna.distributions.FloatDistribution(
                         domain.lower, domain.upper, log=True))
    return out


def study_name(method: str, sigma: float, seed: int) -> str:
    """A study's experiment name (mi_backprop keeps the names it always had)."""
    name = f"{EXPERIMENT}_sigma{sigma:g}_seed{seed}"
    return name if method == "mi_backprop" else f"{name}_{method}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("lambda_search.py", __doc__.splitlines()[0], LAMBDA_SEARCH,
                          search=True, benchmark=GRID.bench)
    args = resolve(parser, "digits", LAMBDA_SEARCH, argv, name=EXPERIMENT)
    grid = replace(GRID, experiment_name=EXPERIMENT)
    try:
        # Every method's config at both ends of the lambda range and each K, before Ray.
        grid.check_read(args.values, args.explicit)
        grid.validate({**args.values, "lam": list(args["lam_range"])})
        trackers.check_installed(args)
        samples = int(args["samples"])
        studies = [(m, float(s), int(seed)) for m in args["method"] for s in args["sigma"]
                   for seed in args["seeds"]]
        study_records = [RecordStore.at(storage_dir(args), study_name(*study)) for study in studies]
        if args.resume and not any(records.exist() for records in study_records):
            raise SweepError(nothing_to_resume(args.out, study_records[0]))
        if args.dry_run:  # what would run; nothing started
            low, high = args["lam_range"]
            print(f"{EXPERIMENT}: preset {args.preset}, {len(studies)} studies x {samples} "
                  f"trials, lam log-uniform in [{low:g}, {high:g}], {args['epochs']} epochs "
                  f"each -> {args.out} (dry run: nothing started)")
            for method, sigma, seed in studies:
                print(f"  study: method {method}, sigma {sigma:g}, seed {seed}")
            return 0
        loaded = start(grid, args, f"{len(studies)} studies x {samples} trials")
        from ray import tune

        resources = start_ray(args)
        trainable = tune.with_parameters(grid.trainable(), **loaded)
        frames = []
        fixed = grid.fixed_values(args.values)
        for (method, sigma, seed), records in zip(studies, study_records, strict=True):
            name = study_name(method, sigma, seed)
            if not args.resume:
                records.clear()
            records.begin()
            space = search_space(args.values, sigma, seed, method)
            searcher, done = make_searcher(samples, seed, space, records)
            if args.resume:
                print(f"resume: study {name}: {done} of {samples} trials finished",
                      flush=True)
            errors = {}
            if done < samples:
                found = run_tuner(args, name, trainable, space, resources,
                                 param_keys=("method", "sigma", "lam", "K", "seed"),
                                 n_trials=samples - done, search_alg=searcher,
                                 num_samples=samples - done, n_done=done)
                errors = trial_errors(found)
            held = point_records(records, fixed)
            frames.append(results_frame(
                [(rows if not rows.empty else pd.DataFrame({"epoch": [0]}), config, key,
                  errors.get(key)) for key, (rows, config, _, _) in held.items()],
                EXPERIMENT, "digits", grid.result_columns()))
        df = pd.concat(frames, ignore_index=True).sort_values(
            ["method", "sigma", "lam", "K", "seed", "epoch"]).reset_index(drop=True)
    except SweepError as exc:
        fail(str(exc))
    return finish(grid, args, df, loaded, after=_write_front, closing=_front_table)


def _pareto_front(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    finals = final_rows(df)
    return pareto_front(finals), finals


def _write_front(args: SweepArgs, df: pd.DataFrame) -> list[Path]:
    front, finals = _pareto_front(df)
    return [Path(p) for p in write_front(front, finals, args.out)]


def _front_table(df: pd.DataFrame) -> str:
    front, _ = _pareto_front(df)
    return (front[["sigma", "seed", "lam", "K", "mi_eval", "train_acc", "test_acc", "chosen"]]
            .to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
