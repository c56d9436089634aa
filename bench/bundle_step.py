"""A trial bundle of B lambdas against the same B points trained one after another, in one run.

    python bench/bundle_step.py                       # the cpu preset's step, lam {0, 0.5, 1}
    python bench/bundle_step.py --batch-size 256 --K 40 --lr 1e-3 --mine-lr 3e-3 \
        --theta-update joint --mine-ema-rate 0 --no-channels-last   # the quick preset's

The B points share a seed and the embedded 4,000 coloured digits (sigma 0.03); each keeps its
own model. Per repeat, the B points alone each take --steps outer steps, then the bundle
(unbiased/methods/bundle.py) takes --steps outer steps of all B, on the same rows; the
ratio of the two times is taken per repeat (a slow phase of a shared machine hits both) and
the table shows medians. On one thread (a `cpu`-preset trial has one CPU).
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
from unbiased.methods.bundle import MIBackpropBundle  # noqa: E402
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lam", default="0,0.5,1", help="the members' lambdas")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--K", type=int, default=80)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--mine-lr", type=float, default=1e-3)
    p.add_argument("--theta-update", default="separate")
    p.add_argument("--mine-ema-rate", type=float, default=0.01, help="0: plain DV")
    p.add_argument("--no-channels-last", action="store_true")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = build(load_mnist5k(), 0.03, seed=0, width=args.width)
    lams = [float(v) for v in args.lam.split(",")]
    cfg = dict(batch_size=args.batch_size, K=args.K, lr=args.lr, mine_lr=args.mine_lr,
               inner_z="batch", theta_update=args.theta_update,
               mine_ema_rate=args.mine_ema_rate or None, mine_standardize=True,
               mi_guard=True, channels_last=not args.no_channels_last)

    def make() -> list[MIBackprop]:
        return [MIBackprop(bench, MIBackpropConfig(**cfg, lam=lam), seed=0) for lam in lams]

    alone, members = make(), make()
    bundle = MIBackpropBundle(members)
    train = bench.train
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    batches = [order[i * args.batch_size:(i + 1) * args.batch_size]
               for i in range(args.steps)]
    # One step each first: lazy state (Adam's moments, allocator pools) out of the timing.
    for rows in batches[:1]:
        for algo in alone:
            algo.update(train.x[rows], train.y[rows], train.c[rows], rows, train)
        bundle.update(*members_batch(train, rows, len(lams)), 1.0)
    ratios, t_alone, t_bundle = [], [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for algo in alone:
            for rows in batches:
                algo.update(train.x[rows], train.y[rows], train.c[rows], rows, train)
        middle = time.perf_counter()
        for rows in batches:
            bundle.update(*members_batch(train, rows, len(lams)), 1.0)
        end = time.perf_counter()
        t_alone.append((middle - start) / args.steps)
        t_bundle.append((end - middle) / args.steps)
        ratios.append(t_alone[-1] / t_bundle[-1])
    print(f"{len(lams)} points (lam {args.lam}), batch {args.batch_size}, K {args.K}, "
          f"{args.theta_update}, width {args.width}, {args.threads} thread(s), "
          f"{args.steps} outer steps x {args.repeats} repeats")
    print("| | ms per outer step of all points |")
    print("|---|---|")
    print(f"| one after another | {statistics.median(t_alone) * 1e3:.0f} |")
    print(f"| one bundle | {statistics.median(t_bundle) * 1e3:.0f} |")
    print(f"speed-up of the bundle (median of per-repeat ratios): "
          f"{statistics.median(ratios):.2f}x")
    return 0


def members_batch(train, rows: torch.Tensor, members: int) -> list[torch.Tensor]:
    """The same rows for every member, in the bundle's layout (x's member axis second)."""
    return [torch.stack([train.x[rows]] * members, dim=1),
            torch.stack([train.y[rows]] * members), torch.stack([train.c[rows]] * members)]


if __name__ == "__main__":
    raise SystemExit(main())
