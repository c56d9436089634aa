"""What Ray Tune adds to the quick digits trials: the same trials through Tune and as plain loops.

    python bench/tune_overhead.py                       # quick preset, 3 epochs, 2 at a time
    python bench/tune_overhead.py --epochs 8 --concurrency 1 --repeats 2

Both sides run the same trial configs (the quick preset, with the overrides below) with the same
number of epochs, one torch thread per trial, `--concurrency` trials at a time:
- plain: `plain_trial` in worker processes, started before the clock starts and at Ray's
  worker niceness; each builds the benchmark, trains, evaluates every epoch and runs mi_eval
  at the end, exactly as the trainable does, but with no reporting and no checkpoints.
- tune: `sweeps.runner.run_tuner`, the sweeps' own Tuner (reuse_actors, one report and one
  checkpoint per epoch, num_to_keep 1, grey digits shared through tune.with_parameters), on a
  Ray started here with ray.init(address="local", num_cpus=2) so no other cluster is joined.
The overhead is (tune wall - plain wall) / plain wall; ray.init is timed and shown apart (a
sweep pays it once). Shorter trials make the fixed per-trial costs a larger share, so a run
with fewer epochs than the preset overstates the overhead of the preset itself.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sweeps.cli import SweepArgs  # noqa: E402
from sweeps.digits_grid import GRID  # noqa: E402
from unbiased.benchmarks.digits.data import GreyDigits, load_mnist5k  # noqa: E402
from unbiased.benchmarks.digits.spec import DIGITS  # noqa: E402
from unbiased.benchmarks.digits.spec import build as build_digits  # noqa: E402
from unbiased.methods import make_method  # noqa: E402
from unbiased.mine import mi_eval  # noqa: E402


def trial_configs(values: dict) -> list[dict]:
    base = {**GRID.fixed_values(values), "num_threads": 1, "device": "cpu"}
    return [{**base, **point} for point in GRID.points(values)]


def plain_trial(config: dict, digits: GreyDigits) -> float:
    """One trial as the trainable runs it, minus Tune: seconds of wall time."""
    start = time.perf_counter()
    torch.set_num_threads(1)
    bench = build_digits(config, digits)
    algo = make_method(config["method"], bench, config, seed=int(config["seed"]), device="cpu")
    for _ in range(int(config["epochs"])):
        algo.run_epoch()
        algo.evaluate()
    mi_eval(algo.train_features(), bench.train.c, seed=int(config["seed"]),
            steps=int(config["mi_eval_steps"]))
    return time.perf_counter() - start


# Ray starts its worker processes at nice 15 (raylet setting worker_niceness); the plain
# workers get the same, so load from other processes on a shared machine hits both sides alike.
RAY_WORKER_NICENESS = 15


def _init_worker() -> None:
    os.nice(RAY_WORKER_NICENESS - os.nice(0))
    torch.set_num_threads(1)


def _ready(_: int) -> int:
    return os.getpid()


def run_plain(configs: list[dict], digits: GreyDigits, concurrency: int) -> float:
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(concurrency, mp_context=ctx, initializer=_init_worker) as pool:
        list(pool.map(_ready, range(4 * concurrency)))  # workers up before the clock starts
        start = time.perf_counter()
        list(pool.map(plain_trial, configs, [digits] * len(configs)))
        return time.perf_counter() - start


def run_tune(configs: list[dict], values: dict, digits: GreyDigits, concurrency: int,
             out: Path) -> tuple[float, int]:
    """Seconds of Tuner.fit and the size in bytes of one trial's checkpoint."""
    from ray import tune

    from sweeps.digits_grid import EXPERIMENT
    from sweeps.runner import run_tuner
    from trainables.tune_trial import trainable_for

    space = GRID.param_space(values, GRID.points(values))
    space.update({"num_threads": 1, "device": "cpu"})
    args = SweepArgs(benchmark="digits", preset="quick", values=values, out=out)
    start = time.perf_counter()
    trainable = tune.with_parameters(trainable_for("digits"), digits=digits)
    grid = run_tuner(args, EXPERIMENT, trainable, space,
                     {"cpu": 2.0 / concurrency, "gpu": 0.0},
                     param_keys=GRID.param_keys(), n_trials=len(configs))
    wall = time.perf_counter() - start
    errors = [r.error for r in grid if r.error is not None]
    if errors:
        raise SystemExit(f"error: {len(errors)} Tune trials failed: {errors[0]}")
    sizes = [sum(f.stat().st_size for f in Path(r.checkpoint.path).rglob("*") if f.is_file())
             for r in grid if r.checkpoint is not None]
    return wall, max(sizes, default=0)


def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3, help="epochs per trial (preset: 8)")
    p.add_argument("--sigma", type=_floats, help="sigmas (preset: 0.03,0.045)")
    p.add_argument("--lam", type=_floats, help="lambdas (preset: 0,1)")
    p.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")])
    p.add_argument("--mi-eval-steps", type=int, default=500, help="(preset: 3000)")
    p.add_argument("--concurrency", type=int, choices=[1, 2], default=2,
                   help="trials at a time on both sides (the quick preset runs 2)")
    p.add_argument("--repeats", type=int, default=1, help="plain/tune pairs, interleaved")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    values = dict(DIGITS["quick"])
    values["epochs"], values["mi_eval_steps"] = args.epochs, args.mi_eval_steps
    for key in ("sigma", "lam", "seeds"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if isinstance(values["K"], int):
        values["K"] = [values["K"]]
    configs = trial_configs(values)

    t0 = time.perf_counter()
    digits = load_mnist5k()
    load_s = time.perf_counter() - t0
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0
    plain, tuned, ckpt = [], [], 0
    try:
        for r in range(args.repeats):
            plain.append(run_plain(configs, digits, args.concurrency))
            print(f"repeat {r}: plain loops {plain[-1]:.1f} s", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                wall, ckpt = run_tune(configs, values, digits, args.concurrency, Path(tmp))
            tuned.append(wall)
            print(f"repeat {r}: tune {tuned[-1]:.1f} s", flush=True)
    finally:
        ray.shutdown()
    p_med, t_med = statistics.median(plain), statistics.median(tuned)
    overheads = [t / q - 1 for t, q in zip(tuned, plain, strict=True)]
    print(f"\n{len(configs)} quick trials x {args.epochs} epochs, {args.concurrency} at a time, "
          f"1 thread each, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print("| | seconds |\n|---|---:|")
    print(f"| plain loops (median of {len(plain)}) | {p_med:.1f} |")
    print(f"| Tune fit (median of {len(tuned)}) | {t_med:.1f} |")
    print(f"| overhead, % of loop time | {100 * statistics.median(overheads):.1f} "
          f"(each repeat: {', '.join(f'{100 * o:.1f}' for o in overheads)}) |")
    print(f"| per trial | {(t_med - p_med) * args.concurrency / len(configs):.2f} |")
    print(f"| ray.init (once per sweep, not in the overhead) | {init_s:.1f} |")
    print(f"| loading the grey digits (once per sweep via with_parameters) | {load_s:.2f} |")
    print(f"| checkpoint size per trial and epoch | {ckpt / 1e6:.1f} MB |")


if __name__ == "__main__":
    main()
