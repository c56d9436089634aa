"""Optuna lambda search on Colored MNIST: lambda (log scale) and K per sigma, label-free objectives.

    python sweeps/lambda_search.py                    # quick preset: 6 trials, embedded data, CPU
    python sweeps/lambda_search.py --preset paper --root data --address auto

One multi-objective Optuna study (Tune's OptunaSearch, TPE) per (method, sigma, seed): minimise
`mi_eval` (MI of the final features, measured by a fresh statistics network) and maximise
`train_acc`. Neither reads test labels or needs an unbiased validation set. lambda is sampled
log-uniformly in --lam-range (so lambda = 0 is never proposed) and K from the --K choices.
Writes OUT/results.parquet, tables and figures like the grid drivers (default OUT is
results/lambda_search_<preset>), plus OUT/pareto.parquet and OUT/pareto.md: each study's
Pareto front with the trial the lowest-MI rule picks on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from sweeps import trackers  # noqa: E402
from sweeps.cli import build_parser, resolve  # noqa: E402
from sweeps.common import SweepError, fail  # noqa: E402
from sweeps.core import trial_errors  # noqa: E402
from sweeps.digits_grid import BENCH, GRID, bias_strength, load_digits  # noqa: E402
from sweeps.done import finished, point_records  # noqa: E402
from sweeps.outputs import (  # noqa: E402
    check_out_dir,
    check_storage_reachable,
    copy_outputs_to_storage,
    storage_dir,
    write_outputs,
)
from sweeps.presets import LAMBDA_SEARCH  # noqa: E402
from sweeps.ray_init import check_resources, init_ray  # noqa: E402
from sweeps.results_frame import all_ok, results_frame  # noqa: E402
from sweeps.runner import run_tuner  # noqa: E402
from trainables.record import Records  # noqa: E402
from unbiased.settings import POINT_KEY  # noqa: E402

EXPERIMENT = "lambda_search"
OBJECTIVES = ["mi_eval", "train_acc"]
MODES = ["min", "max"]


def search_space(values: dict, sigma: float, seed: int, method: str = "mi_backprop") -> dict:
    """One study's space: lambda log-uniform, K a choice (for methods that have K), under the
    trial's point (its record's key: a resumed study's trials find their records)."""
    from ray import tune

    from sweeps.core import has_key

    low, high = (float(v) for v in values["lam_range"])
    point: dict = {"method": method, "sigma": float(sigma), "seed": int(seed),
                   "lam": tune.loguniform(low, high)}
    if has_key(method, "K"):
        point["K"] = tune.choice([int(k) for k in values["K"]])
    return {**GRID.fixed_values(values),
            "num_threads": max(1, int(float(values["cpus_per_trial"]))), POINT_KEY: point}


def make_searcher(samples: int, seed: int, space: dict | None = None,
                  records: Records | None = None):
    """Multi-objective TPE. The first third of the trials are random (TPE's start-up) and at
    most that many run at once, so later proposals can use the finished ones. With the
    study's `records` (a resumed study): the finished trials are the study's first, with
    their objectives, and the unfinished ones are proposed again (each continues from its
    record); returns the searcher and how many trials are finished."""
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
    for record in (records.read_all().values() if records is not None else []):
        params = {f"{POINT_KEY}/{k}": v for k, v in record.config.items()
                  if k in space[POINT_KEY] and not isinstance(space[POINT_KEY][k], str | int
                                                               | float)}
        rows = record.metrics()
        if finished(record) and rows and all(k in rows[-1] for k in OBJECTIVES):
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("lambda_search.py", __doc__.splitlines()[0], LAMBDA_SEARCH,
                          search=True, benchmark=BENCH)
    args = resolve(parser, "digits", LAMBDA_SEARCH, argv, name=EXPERIMENT)
    try:
        # Every method's config at both ends of the lambda range and each K, before Ray.
        GRID.check_read(args.values, args.explicit)
        GRID.validate({**args.values, "lam": list(args["lam_range"])})
        trackers.check_installed(args)
        check_storage_reachable(args)
        check_out_dir(args, EXPERIMENT)
        digits = load_digits(args)
        facts, lines = bias_strength(args, digits)
        args.extra.update(facts)
        trackers.start(args, EXPERIMENT)
        samples = int(args["samples"])
        studies = [(m, float(s), int(seed)) for m in args["method"] for s in args["sigma"]
                   for seed in args["seeds"]]
        print(f"{EXPERIMENT}: preset {args.preset}, {len(studies)} studies x {samples} trials "
              f"({len(digits.train_y)} train / {len(digits.test_y)} test digits from "
              f"{digits.source}), {args['epochs']} epochs each -> {args.out}", flush=True)
        print("\n".join(lines), flush=True)
        init_ray(args.address)
        from ray import tune

        from trainables.tune_trial import trainable_for

        resources = {"cpu": float(args["cpus_per_trial"]), "gpu": float(args["gpus_per_trial"])}
        check_resources(args.address, resources["cpu"], resources["gpu"])
        trainable = tune.with_parameters(trainable_for("digits"), digits=digits)
        frames = []
        fixed = GRID.fixed_values(args.values)
        for method, sigma, seed in studies:
            name = f"{EXPERIMENT}_sigma{sigma:g}_seed{seed}"
            if method != "mi_backprop":  # mi_backprop keeps the study names it always had
                name += f"_{method}"
            records = Records.at(storage_dir(args), name)
            if not args.resume:
                records.clear()
            space = search_space(args.values, sigma, seed, method)
            searcher, done = make_searcher(samples, seed, space, records)
            if args.resume:
                print(f"resume: study {name}: {done} of {samples} trials finished",
                      flush=True)
            errors = {}
            if done < samples:
                grid = run_tuner(args, name, trainable, space, resources,
                                 param_keys=("method", "sigma", "lam", "K", "seed"),
                                 n_trials=samples - done, search_alg=searcher,
                                 num_samples=samples - done, n_done=done)
                errors = trial_errors(grid)
            held = point_records(records, fixed)
            frames.append(results_frame(
                [(rows if not rows.empty else pd.DataFrame({"epoch": [0]}), config, key,
                  errors.get(key)) for key, (rows, config, _, _) in held.items()],
                EXPERIMENT, "digits", GRID.result_columns()))
        df = pd.concat(frames, ignore_index=True).sort_values(
            ["method", "sigma", "lam", "K", "seed", "epoch"]).reset_index(drop=True)
        written = write_outputs(args, EXPERIMENT, df)
        front = _write_front(args.out, df, written)
        kept = copy_outputs_to_storage(args, written)
        trackers.finish(args, df, written)
    except SweepError as exc:
        fail(str(exc))
    print(front[["sigma", "seed", "lam", "K", "mi_eval", "train_acc", "test_acc", "chosen"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for path in written:
        print(f"wrote {path}")
    if kept is not None:
        print(f"and copied them to {kept} (they outlive this machine; --resume rebuilds them)")
    for line in trackers.hints(args, storage_dir(args)):
        print(line, flush=True)
    return 0 if all_ok(df) else 1


def _write_front(out: Path, df: pd.DataFrame, written: list[Path]) -> pd.DataFrame:
    from analysis.pareto import pareto_front, write_front
    from analysis.results import final_rows

    finals = final_rows(df)
    front = pareto_front(finals)
    written += write_front(front, finals, out)
    return front


if __name__ == "__main__":
    from sweeps.ending import end_driver  # leaves Ray, then ends the process

    end_driver(main)
