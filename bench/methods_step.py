"""Seconds per training step of each method against plain ERM (no MINE), measured in one run.

    python bench/methods_step.py                                   # quick preset's settings
    python bench/methods_step.py --batch-size 1024 --K 80 --lr 1e-4 --theta-update separate \
        --mine-ema-rate 0.01 --channels-last                       # the cpu preset's

Each method (and `erm`: g and f only, the baseline; `mi_backprop@0`: lam = 0, ERM for g and f
with MINE trained alongside, as the sweeps' ERM trials run) keeps its own model on the
embedded 4,000 coloured digits; the methods are timed in turn, --repeats times, --steps
mini-batches each, so slow phases of a shared machine hit all of them, and each repeat's time
is divided by the ERM time of the same repeat. The table shows medians. Absolute times on a
shared machine are noise; the ratios are the signal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from unbiased.benchmarks.digits.data import build, load_mnist5k  # noqa: E402
from unbiased.methods import ERM, METHODS, TrainConfig, make_method  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(["mi_backprop@0", *METHODS]))
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--K", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--inner-z", default="batch")
    p.add_argument("--theta-update", default="joint")
    p.add_argument("--mine-ema-rate", type=float, default=None)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = build(load_mnist5k(), 0.03, seed=0)
    values = {"lam": args.lam, "batch_size": args.batch_size, "K": args.K, "lr": args.lr,
              "inner_z": args.inner_z, "theta_update": args.theta_update,
              "mine_ema_rate": args.mine_ema_rate, "channels_last": args.channels_last}
    plain = TrainConfig(lam=0.0, batch_size=args.batch_size, lr=args.lr,
                        channels_last=args.channels_last)
    algos = {"erm": ERM(bench, plain, seed=0)}
    for name in args.methods.split(","):
        method, _, lam = name.partition("@")
        algos[name] = make_method(method, bench, {**values, "lam": float(lam or args.lam)},
                                  seed=0)
    rows = args.steps * args.batch_size
    train = bench.train
    idx = torch.arange(rows) % len(train)
    part = type(train)(train.x[idx], train.y[idx], train.c[idx])
    if args.channels_last:
        part = type(train)(part.x.contiguous(memory_format=torch.channels_last), part.y, part.c)
    for algo in algos.values():  # warm-up: first-call allocations, kernel selection
        algo.run_epoch(part)
    ratios: dict[str, list[float]] = {name: [] for name in algos}
    seconds: dict[str, list[float]] = {name: [] for name in algos}
    for _ in range(args.repeats):
        times = {}
        for name, algo in algos.items():
            start = time.perf_counter()
            algo.run_epoch(part)
            times[name] = (time.perf_counter() - start) / args.steps
        for name, t in times.items():
            seconds[name].append(t)
            ratios[name].append(t / times["erm"])
    print(f"batch {args.batch_size}, K {args.K}, lam {args.lam}, inner z {args.inner_z}, "
          f"{args.threads} thread(s), {args.steps} steps x {args.repeats} repeats "
          f"(medians):")
    print(f"{'method':<16}{'s/step':>10}{'x ERM':>8}")
    for name in algos:
        print(f"{name:<16}{statistics.median(seconds[name]):>10.4f}"
              f"{statistics.median(ratios[name]):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
