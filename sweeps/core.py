"""The one sweep core every grid driver is a small spec on: a registered benchmark's spec
(unbiased/benchmarks/) plus a driver's overrides, every value validated before Ray starts."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pandas as pd

from analysis.specs import DATA_AXES
from sweeps import trackers
from sweeps.cli import SweepArgs, build_parser, flag_of, resolve
from sweeps.common import SweepError, fail
from sweeps.finished_trials import import_done, point_records, read_done, split_done
from sweeps.outputs import (
    check_out_dir,
    check_storage_reachable,
    copy_outputs_to_storage,
    storage_dir,
    write_outputs,
)
from sweeps.ray_init import check_resources, init_ray
from sweeps.results_frame import all_ok, results_frame
from sweeps.runner import run_tuner
from sweeps.signals import defer_stop_signals
from trainables.record import RecordStore, trial_key
from unbiased.benchmarks import benchmark_spec
from unbiased.benchmarks.spec import BenchmarkSpec
from unbiased.search import ARMS
from unbiased.settings import POINT_KEY, SETTINGS_KEY, WARM_FROM, TrialSettings, flat_point

# Trial keys read by the trainable itself (unbiased/trial.py), whatever the method.
RUN_KEYS = ("epochs", *(f.name for f in fields(TrialSettings)))
# Values the driver uses itself; they never reach a trial as such.
DRIVER_KEYS = frozenset({"method", "lam", "K", "seeds", "cpus_per_trial", "gpus_per_trial",
                         "scheduler", "samples", "lam_range", "weights", "method_lam",
                         "arms", "draws", "draw_of", "search_seed"})


def method_keys() -> tuple[str, ...]:
    from unbiased.methods import METHODS, config_keys

    return tuple(dict.fromkeys(k for name in METHODS for k in config_keys(name)))


def has_key(method: str, key: str) -> bool:
    from unbiased.methods import config_keys

    return key in config_keys(method)


@dataclass(frozen=True)
class GridSpec:
    """A registered benchmark's grid, with what a driver sets otherwise: its experiment
    (default `<name>_grid`; another one names the default OUT after it), data axes and prog."""

    bench: BenchmarkSpec
    experiment_name: str | None = None
    own_axes: tuple[str, ...] | None = None
    own_prog: str | None = None

    @property
    def experiment(self) -> str:
        return self.experiment_name or f"{self.bench.name}_grid"

    @property
    def data_axes(self) -> tuple[str, ...]:
        return self.bench.data_axes if self.own_axes is None else self.own_axes

    @property
    def prog(self) -> str:
        return self.own_prog or f"python -m sweeps {self.bench.name}"

    @property
    def out_name(self) -> str | None:
        """The default OUT's name when not the benchmark's (results/<it>_<preset>)."""
        return None if self.experiment == f"{self.bench.name}_grid" else self.experiment

    def load(self, args: SweepArgs) -> tuple[dict[str, object], str]:
        """The data, read once in the driver (the trials get it through the object store),
        and a phrase for the start line; missing data is a SweepError naming its fetch."""
        from sweeps.fetch import sweep_missing_data
        from unbiased.data import DataError

        try:
            return self.bench.load(args.values)
        except DataError as exc:
            raise SweepError(sweep_missing_data(exc, args)) from None

    def trainable(self) -> Callable:
        """The Tune function (imported late: it imports torch and ray)."""
        from trainables.tune_trial import trainable_for

        return trainable_for(self.bench.name)

    def for_preset(self, preset: str) -> GridSpec:
        """The grid a preset runs: one naming an experiment of its own (digits' ablations)
        runs under it, over its own data axes where it lists them (sweeps/cli.py GRID_KEYS)."""
        values = self.bench.presets[preset]
        if "experiment" not in values:
            return self
        return replace(self, experiment_name=str(values["experiment"]),
                       own_axes=tuple(values.get("data_axes", self.data_axes)))

    def trial_keys(self) -> tuple[str, ...]:
        return (*RUN_KEYS, *method_keys(), *self.bench.build_keys)

    def fixed_values(self, values: dict) -> dict:
        axes = {*self.data_axes, "lam", "K"}
        return {k: values[k] for k in self.trial_keys() if k in values and k not in axes}

    def check_keys(self, values: dict) -> None:
        """Every resolved value reaches the trials or is the driver's own: a flag that a
        trial would silently ignore is a bug here, not a surprise in the results."""
        known = set(self.trial_keys()) | DRIVER_KEYS | set(self.data_axes)
        stray = sorted(set(values) - known)
        if stray:
            raise SweepError(f"{self.prog}: settings no trial reads: {', '.join(stray)}")

    def check_read(self, values: dict, explicit: frozenset[str]) -> None:
        """A method setting given on the command line that no method of the sweep reads
        (`--method hsic --mine-ema-rate 0.01`) is refused: the run would differ from what
        was asked without a word."""
        from unbiased.methods import METHODS, config_keys

        methods = (list(dict.fromkeys(ARMS[arm].method for arm in values["arms"]))
                   if values.get("arms") else list(values.get("method") or ["mi_backprop"]))
        read = {key for method in methods for key in config_keys(method)}
        for key in sorted(explicit & set(method_keys()) - read):
            readers = [name for name in METHODS if key in config_keys(name)]
            raise SweepError(f"{flag_of(key)} is read only by method "
                             f"{', '.join(readers)}, and this sweep runs "
                             f"{', '.join(methods)}: drop the flag or add the method to "
                             f"--method")

    def points(self, values: dict) -> list[dict]:
        """Every trial's grid point (a method in `method_lam` runs its own non-zero lambdas),
        or a tuning preset's draws. Ordered seed first, then method: Tune starts trials in
        this order, so a grid cut off by a session's end holds whole seeds, and within a seed
        the first method's rows at every data point before any competitor's."""
        if values.get("arms"):
            from sweeps.tuning import search_points

            return search_points(values, self.data_axes)
        methods = list(values.get("method") or ["mi_backprop"])
        # A flag sets one value of an axis (`--no-mi-guard` on the critic ablation).
        axes = [[(key, v) for v in (values[key] if isinstance(values[key], list)
                                    else [values[key]])] for key in self.data_axes]
        own = values.get("method_lam") or {}
        erm = [0.0] if any(lam == 0 for lam in values["lam"]) else []
        lams = {m: erm + [v for v in own[m] if v != 0] if m in own else list(values["lam"])
                for m in methods}
        out = []
        for data in itertools.product(*axes):
            for i, method in enumerate(methods):
                for lam in lams[method]:
                    if lam == 0 and i > 0:
                        continue  # the same ERM model as the first method's lam = 0
                    Ks = values["K"] if has_key(method, "K") else [None]
                    if lam == 0:
                        Ks = Ks[:1]  # plain ERM whatever K: once, under the first K
                    for K, seed in itertools.product(Ks, values["seeds"]):
                        point = {**dict(data), "method": method, "lam": float(lam),
                                 "seed": int(seed)}
                        if K is not None:
                            point["K"] = int(K)
                        out.append(point)
        seed_rank = {int(seed): i for i, seed in enumerate(values["seeds"])}
        method_rank = {method: i for i, method in enumerate(methods)}
        return sorted(out, key=lambda p: (seed_rank[p["seed"]], method_rank[p["method"]]))

    def validate(self, values: dict, points: list[dict] | None = None) -> list[dict]:
        """The points (the grid of `values` unless given), every one's config checked."""
        from unbiased.methods import method_config

        self.check_keys(values)
        fixed = self.fixed_values(values)
        points = self.points(values) if points is None else points
        for point in points:
            try:
                method_config(point["method"], {**fixed, **flat_point(point)})
            except (ValueError, TypeError) as exc:
                raise SweepError(f"invalid settings for method {point['method']}: {exc}"
                                 ) from None
        return points

    def param_space(self, values: dict, trials: list[dict]) -> dict:
        """Tune's grid: a trial per entry of `trials` (a point, or a bundle of points)."""
        from ray import tune

        return {**self.fixed_values(values),
                "num_threads": max(1, int(float(values["cpus_per_trial"]))),
                POINT_KEY: tune.grid_search(trials)}

    def result_columns(self) -> dict[str, str]:
        return {key: key for key in ("method", "lam", "K", "seed", "epochs", "arm", "draw",
                                     *self.data_axes)}

    def param_keys(self) -> tuple[str, ...]:
        return ("method", *self.data_axes, "arm", "draw", "lam", "K", "seed")


def benchmark_grid(name: str, **overrides) -> GridSpec:
    """The grid `python -m sweeps NAME` runs, with a driver's `overrides` (GridSpec's fields)."""
    return GridSpec(benchmark_spec(name), **overrides)


def bundle_points(points: list[dict], size: int, fixed: dict) -> list[dict]:
    """The trials of `points` under `--bundle size`: mi_backprop points with inner z "batch"
    that agree on every setting but the per-member ones (unbiased/methods/bundle.py) share
    bundles of up to `size`; the rest run alone. Trials keep grid order (by first point)."""
    if size <= 1:
        return points
    from unbiased.methods import config_keys, method_config
    from unbiased.methods.bundle import PER_MEMBER_FIELDS
    from unbiased.trial import MEMBERS_KEY

    shared_keys = [k for k in config_keys("mi_backprop") if k not in PER_MEMBER_FIELDS]
    groups: dict[tuple, list[int]] = {}
    for i, point in enumerate(points):
        if point["method"] != "mi_backprop":
            continue
        cfg = method_config("mi_backprop", {**fixed, **flat_point(point)})
        if cfg.inner_z != "batch":
            continue
        key = tuple(repr(getattr(cfg, k)) for k in shared_keys)
        groups.setdefault(key, []).append(i)
    first_of: dict[int, dict] = {i: point for i, point in enumerate(points)}
    for members in groups.values():
        for start in range(0, len(members), size):
            chunk = members[start:start + size]
            for i in chunk[1:]:
                first_of.pop(i)
            if len(chunk) > 1:
                first_of[chunk[0]] = {MEMBERS_KEY: [points[i] for i in chunk]}
    return [first_of[i] for i in sorted(first_of)]


def run_grid(spec: GridSpec, argv: list[str] | None = None) -> int:
    bench = spec.bench
    parser = build_parser(spec.prog, bench.description, bench.presets, benchmark=bench)
    args = resolve(parser, bench.name, bench.presets, argv, name=spec.out_name)
    return run_points(spec.for_preset(args.preset), args)


def run_points(spec: GridSpec, args: SweepArgs, points: list[dict] | None = None,
               after: Callable[[SweepArgs, pd.DataFrame], list[Path]] | None = None) -> int:
    """Run the trials of `points` (args' grid unless given) not yet finished and write the
    results of all; `after(args, df)` writes more outputs before the trackers log them."""
    try:
        spec.check_read(args.values, args.explicit)
        trackers.check_installed(args)
        points = spec.validate(args.values, points)
        fixed = spec.fixed_values(args.values)
        records = RecordStore.at(storage_dir(args), spec.experiment)
        todo, done_line, taken = take_done(spec, args, records, points)
        if args.values.get("warm_start"):
            todo = warm_sources(spec, args, todo, points)
        trials = bundle_points(todo, args.bundle, fixed)
        if args.bundle > 1 and len(todo) > 1 and len(trials) == len(todo):
            done_line = [*done_line, f"--bundle {args.bundle}: no two trials can share one "
                                     f"(bundles take mi_backprop points with inner z 'batch' "
                                     f"that share K and their other settings): a trial each"]
        if args.dry_run:
            dry_run(spec, args, trials, done_line)
            return 0
        loaded = start(spec, args, f"{len(todo)} trials", running=bool(todo),
                       tail=(f"; {len(trials)} Tune trials (--bundle {args.bundle})"
                             if len(trials) < len(todo) else ""))
        if not args.resume:
            records.clear()  # a new sweep: an earlier one's trials are not its own
        if args.done is not None:
            import_done(records, args.done, taken, fixed)
        for line in done_line:
            print(line, flush=True)
        errors: dict[str, object] = {}
        if trials:
            from ray import tune

            resources = start_ray(args)
            records.begin()
            trainable = tune.with_parameters(spec.trainable(), **loaded)
            n_done = len(points) - len(todo)
            for part in warm_parts(trials):  # the warm starts' baselines first
                grid = run_tuner(args, spec.experiment, trainable,
                                 spec.param_space(args.values, part), resources,
                                 param_keys=spec.param_keys(), n_trials=len(part),
                                 n_done=n_done)
                errors.update(trial_errors(grid))
                n_done += len(part)
        df = results_frame(trial_rows(records, fixed, points, errors), spec.experiment,
                           spec.bench.name, spec.result_columns())
    except SweepError as exc:
        fail(str(exc))
    return finish(spec, args, df, loaded, after)


def start(spec: GridSpec, args: SweepArgs, trials: str, running: bool = True,
          tail: str = "") -> dict[str, object]:
    """The start every sweep shares, before Ray; returns the loaded objects the trials get."""
    defer_stop_signals()
    if running:
        check_local_gpu(args)
        check_storage_reachable(args)
    check_out_dir(args, spec.experiment)
    loaded, data = spec.load(args)
    facts, lines = (({}, []) if spec.bench.describe is None
                    else spec.bench.describe(args.values, loaded))
    args.extra.update(facts)
    trackers.start(args, spec.experiment)
    print(f"{spec.experiment}: preset {args.preset}, {trials} ({data}), {args['epochs']} "
          f"epochs each -> {args.out}{tail}", flush=True)
    for line in lines:
        print(line, flush=True)
    return loaded


def start_ray(args: SweepArgs) -> dict[str, float]:
    init_ray(args.address)
    resources = {"cpu": float(args["cpus_per_trial"]), "gpu": float(args["gpus_per_trial"])}
    check_resources(args.address, resources["cpu"], resources["gpu"])
    return resources


def finish(spec: GridSpec, args: SweepArgs, df: pd.DataFrame, loaded: dict[str, object],
           after: Callable[[SweepArgs, pd.DataFrame], list[Path]] | None = None,
           closing: Callable[[pd.DataFrame], str] | None = None) -> int:
    """The end every sweep shares: outputs written, copied and logged, then `closing(df)`
    (default: each trial's reported row) and the paths printed; 1 where a trial failed."""
    try:
        if spec.bench.extra_rows is not None:  # non-neural baselines (German's SVM)
            df = pd.concat([df, spec.bench.extra_rows(args.values, loaded, df)],
                           ignore_index=True)
        written = write_outputs(args, spec.experiment, df)
        if after is not None:
            written += after(args, df)
        kept = copy_outputs_to_storage(args, written)
        trackers.finish(args, df, written)
    except SweepError as exc:
        fail(str(exc))
    print(closing(df) if closing is not None else summary(df, spec))
    for path in written:
        print(f"wrote {path}")
    if kept is not None:
        print(f"and copied them to {kept} (they outlive this machine; --resume rebuilds them)")
    for line in trackers.hints(args, storage_dir(args)):
        print(line, flush=True)
    return 0 if all_ok(df) else 1


def trial_errors(grid) -> dict[str, object]:
    """The error of each trial Tune ran that failed, by the key of each of its points."""
    from unbiased.trial import MEMBERS_KEY

    errors = {}
    for result in grid:
        point = (result.config or {}).get(POINT_KEY) or {}
        if result.error is not None:
            errors |= {trial_key([m]): result.error for m in point.get(MEMBERS_KEY, [point])}
    return errors


def trial_rows(records: RecordStore, fixed: dict, points: list[dict], errors: dict[str, object]
               ) -> list[tuple[pd.DataFrame, dict, str, object]]:
    held = point_records(records, fixed, points)
    out = []
    for point in points:
        key = trial_key([point])
        error = errors.get(key)
        if key in held:
            rows, config, _, _ = held[key]
        else:
            rows, config = pd.DataFrame(), {**fixed, **flat_point(point)}
            error = error or "the trial never reported (no record)"
        if rows.empty:
            rows = pd.DataFrame({"epoch": [0]})
        out.append((rows, config, key, error))
    return out


def warm_parts(trials: list[dict]) -> list[list[dict]]:
    """The launches: first the baselines a warm start reads the finished record of, then
    the rest."""
    sources = {p[WARM_FROM] for p in trials if WARM_FROM in p}
    first = [t for t in trials if trial_key([t]) in sources]
    rest = [t for t in trials if all(t is not f for f in first)]
    return [part for part in (first, rest) if part]


def baseline_key(spec: GridSpec, point: dict) -> tuple:
    """What a lam > 0 point shares with the lam = 0 trial it warm-starts from."""
    return (*(point.get(axis) for axis in spec.data_axes), point["seed"])


def warm_sources(spec: GridSpec, args: SweepArgs, points: list[dict],
                 grid: list[dict] | None = None) -> list[dict]:
    """--warm-start: each lam > 0 point with the key of its lam = 0 trial (`WARM_FROM`),
    which must be in `grid` (`points` unless given)."""
    if args.bundle > 1:
        raise SweepError("--warm-start runs each trial on its own: drop --bundle")
    baselines = {baseline_key(spec, p): trial_key([p]) for p in (grid or points)
                 if p["lam"] == 0}
    out = []
    for point in points:
        if point["lam"] > 0:
            source = baselines.get(baseline_key(spec, point))
            if source is None:
                said = ", ".join(f"{k} {point[k]}" for k in ("method", *spec.data_axes, "lam",
                                                             "seed") if point.get(k) is not None)
                raise SweepError(f"--warm-start: the trial {said} starts "
                                 f"from the lam = 0 trial of its point and seed, which this "
                                 f"sweep does not run: add 0 to --lam")
            point = {**point, WARM_FROM: source}
        out.append(point)
    return out


def check_local_gpu(args: SweepArgs) -> None:
    """A local sweep asking for a GPU torch cannot see would wait forever for Ray to place
    its trials or fail every one: one line before Ray starts instead."""
    device = str(args.values.get("device", "auto"))
    gpus = float(args.values.get("gpus_per_trial", 0) or 0)
    if args.address or not (device.startswith("cuda") or gpus > 0):
        return
    import torch

    if torch.cuda.is_available():
        return
    asked = " and ".join(part for part in (
        f"--device {device}" if device.startswith("cuda") else "",
        f"--gpus-per-trial {gpus:g}" if gpus > 0 else "") if part)
    build = (f"torch {torch.__version__}, "
             + (f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"))
    raise SweepError(f"{asked} (preset {args.preset}), but torch sees no CUDA device on this "
                     f"machine ({build}): run it where a GPU is, join a GPU cluster with "
                     f"--address, or pass --device cpu --gpus-per-trial 0")


def nothing_to_resume(out: Path, records: RecordStore) -> str:
    """Why `--resume` into `out` cannot go on: no sweep was launched there."""
    return (f"cannot resume {out}: it holds no sweep (no trial records at {records.root}); "
            f"check the path, or leave out --resume to start a sweep there (a sweep begun "
            f"before trials kept records: `python -m sweeps export {out} CSV`, then --done "
            f"CSV into a new --out)")


def take_done(spec: GridSpec, args: SweepArgs, records: RecordStore, points: list[dict]
              ) -> tuple[list[dict], list[str], list[tuple[dict, pd.DataFrame]]]:
    """The points neither a finished record (--resume) nor `--done CSV` holds, lines saying
    so, and the CSV's whole points with their rows. With --warm-start a lam = 0 trial a point
    to run starts from runs again if its record has no checkpoint (CSV rows carry none)."""
    fixed = spec.fixed_values(args.values)
    if args.resume and not records.exist():
        check_out_dir(args, spec.experiment)  # another experiment's results: that, first
        raise SweepError(nothing_to_resume(args.out, records))
    held = point_records(records, fixed, points) if args.resume else {}
    done = {key for key, (_, _, _, ended) in held.items() if ended}
    lines = []
    if args.resume:
        lines.append(f"resume: {len(done)} of {len(points)} trials already finished; the "
                     f"others continue from their last checkpoints")
    whole: list[tuple[dict, pd.DataFrame]] = []
    if args.done is not None:
        _, whole = split_done(args.done, read_done(args.done, spec.param_keys()), points,
                              fixed)
        done |= {trial_key([p]) for p, _ in whole}
        lines.append(f"{len(whole)} of {len(points)} trials finished in {args.done}: not run "
                     f"again, their rows join the results")
    todo = [p for p in points if trial_key([p]) not in done]
    if args.values.get("warm_start"):
        needed = {baseline_key(spec, p) for p in todo if p["lam"] > 0}
        again = [p for p in points if p["lam"] == 0 and baseline_key(spec, p) in needed
                 and trial_key([p]) in done and not _has_checkpoint(records, held, p)]
        if again:
            todo = [p for p in points if any(p is q for q in [*todo, *again])]
            lines.append(f"--warm-start: {len(again)} of them run again, for the checkpoint "
                         f"the trials still to run start from")
    return todo, lines, whole


def _has_checkpoint(records: RecordStore, held: dict, point: dict) -> bool:
    key = trial_key([point])
    if key not in held:
        return False
    record = records.read(held[key][2])
    return record is not None and record.checkpoint is not None


def dry_run(spec: GridSpec, args: SweepArgs, trials: list[dict],
            notes: Sequence[str] = ()) -> None:
    """One line per grid point (and the bundle it trains in), then the shared settings."""
    from unbiased.trial import MEMBERS_KEY

    points = [(i, p) for i, trial in enumerate(trials)
              for p in trial.get(MEMBERS_KEY, [trial])]
    bundled = len(points) > len(trials)
    print(f"{spec.experiment}: preset {args.preset}, {len(points)} trials, "
          f"{args['epochs']} epochs each -> {args.out} (dry run: nothing started)"
          + (f"; {len(trials)} Tune trials (--bundle {args.bundle})" if bundled else ""))
    for line in notes:
        print(line)
    keys = [k for k in spec.param_keys() if any(p.get(k) is not None for _, p in points)]
    warm = any(WARM_FROM in p for _, p in points)  # --warm-start: which trial each starts from
    # A tuning preset's drawn and held settings (sweeps/tuning.py), a column each.
    drawn = sorted({k for _, p in points for k in p.get(SETTINGS_KEY) or {}})
    rows = [{**({"bundle": i} if bundled else {}), **({"trial": i} if warm else {}),
             **{k: "-" if p.get(k) is None else p[k] for k in keys},
             **{k: (p.get(SETTINGS_KEY) or {}).get(k, "-") for k in drawn},
             **({"starts_from": p.get(WARM_FROM, "-")} if warm else {})} for i, p in points]
    print(pd.DataFrame(rows, dtype=object).to_string(index=False))
    fixed = {k: v for k, v in spec.fixed_values(args.values).items() if k not in drawn}
    print("shared: " + ", ".join(f"{k}={fixed[k]}" for k in sorted(fixed)))


def summary(df: pd.DataFrame, spec: GridSpec) -> str:
    """Each trial's reported row (its selected epoch), sorted by its grid point."""
    rows = df[df["selected"]] if "selected" in df.columns else df
    cols = [c for c in ("method", *spec.data_axes, "lam", "K", "seed", "epoch",
                        *spec.bench.summary, "mi", "mi_eval", "status") if c in rows.columns]
    keys = list(dict.fromkeys(c for c in ("method", *DATA_AXES, "lam", "K", "seed")
                              if c in cols))
    return rows[cols].sort_values(keys).to_string(index=False,
                                                  float_format=lambda v: f"{v:.3f}")
