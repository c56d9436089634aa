"""What the authors' MINE schedule (`--inner-z first_k`) costs per epoch on full MNIST beside
the `cpu` preset's `batch` inner z, timed in the same run on one thread (bench/RESULTS.md,
section 11).

    python bench/first_k_cost.py --root ../shared/data/mnist [--steps 10]

first_k: one MINE step per batch of the epoch before the first theta step (timed whole),
then per theta step K = 40 MINE steps on fresh forwards of the epoch's first 40 batches
(batch 128, T with 3 hidden layers, z = ReLU(fc), as the authors). batch: the `cpu`
preset's step (batch 1024, K = 80 on the batch's own z). Both on the same benchmark
(sigma .03, z = ReLU(fc)). Prints seconds per theta step,
a projected epoch, and the ratio of the two epochs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from unbiased.benchmarks.digits.data import build, load_mnist  # noqa: E402
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig  # noqa: E402

VARIANTS: dict[str, dict[str, object]] = {
    "first_k (authors)": {"inner_z": "first_k", "K": 40, "batch_size": 128,
                          "mine_hidden_layers": 3},
    "batch (cpu preset)": {"inner_z": "batch", "K": 80, "batch_size": 1024,
                           "mine_ema_rate": 0.01, "mine_standardize": True},
}


def epoch_minutes(bench, options: dict[str, object], steps: int) -> tuple[float, float]:
    """(seconds per theta step, projected minutes per epoch incl. any epoch pass)."""
    cfg = MIBackpropConfig(lam=1.0, lr=1e-4, mine_lr=1e-4, theta_update="separate", **options)
    algo = MIBackprop(bench, cfg, seed=0)
    train = algo.bench.train
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    bs = cfg.batch_size
    start = time.perf_counter()
    algo.start_epoch(order, train)  # the epoch pass (first_k); nothing for batch
    pass_s = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(steps):
        rows = order[step * bs:(step + 1) * bs]
        [(x, y, c)] = list(train.batches(bs, rows))
        algo.update(x, y, c, rows, train)
    per_step = (time.perf_counter() - start) / steps
    return per_step, (pass_s + per_step * (len(train) // bs)) / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="../shared/data/mnist", help="MNIST root")
    parser.add_argument("--steps", type=int, default=10, help="theta steps timed per variant")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench = build(load_mnist(args.root), 0.03, seed=0, z_relu=True)
    minutes = {}
    for name, options in VARIANTS.items():
        per_step, minutes[name] = epoch_minutes(bench, options, args.steps)
        print(f"{name:20s} {per_step:6.2f} s per theta step, ~{minutes[name]:5.1f} min per "
              "epoch", flush=True)
    a, b = minutes
    print(f"epoch ratio {a} / {b}: {minutes[a] / minutes[b]:.1f}x")


if __name__ == "__main__":
    main()
