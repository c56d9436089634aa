"""Per-epoch curves of one Colored MNIST run outside Ray: the probe behind docs/MEASURED.md,
"Full MNIST, sigma 0.03" (what keeps lam = 1 from decaying toward ERM on full MNIST).

    python bench/paper_scale.py --root ../shared/data/mnist --sigma 0.03 --lam 1 \\
        --epochs 12 --batch-size 128 --K 40 --theta-update separate --out run.jsonl

Prints and appends to --out one JSON line per epoch: train/test accuracy, the trial's own MI
estimate, mi_eval (a fresh statistics network on the frozen training z) and mi_eval_cond (the
same with c shuffled within each label: colour beyond the label), seconds per epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from unbiased.benchmarks.digits.data import build, load_grey_digits  # noqa: E402
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig  # noqa: E402
from unbiased.mine import mi_eval  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=None)
    p.add_argument("--source", default="mnist")
    p.add_argument("--sigma", type=float, default=0.03)
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--K", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--mine-lr", type=float, default=1e-4)
    p.add_argument("--inner-z", default="batch")
    p.add_argument("--theta-update", default="separate")
    p.add_argument("--mine-ema-rate", type=float, default=None)
    p.add_argument("--mine-hidden-layers", type=int, default=2)
    p.add_argument("--no-rescale", action="store_true")
    p.add_argument("--z-relu", action="store_true")
    p.add_argument("--width", type=int, default=64, help="LeNet conv channels")
    p.add_argument("--palette", default="separated")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--mi-eval-every", type=int, default=1)
    p.add_argument("--mi-eval-steps", type=int, default=1500)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    digits = load_grey_digits(a.source, a.root)
    bench = build(digits, a.sigma, a.seed, z_relu=a.z_relu, width=a.width,
                  palette=a.palette)
    cfg = MIBackpropConfig(lam=a.lam, K=a.K, batch_size=a.batch_size, lr=a.lr, mine_lr=a.mine_lr,
                           inner_z=a.inner_z, theta_update=a.theta_update,
                           mine_ema_rate=a.mine_ema_rate, mine_hidden_layers=a.mine_hidden_layers,
                           rescale_mi_grad=not a.no_rescale, channels_last=a.channels_last)
    algo = MIBackprop(bench, cfg, seed=a.seed)
    for epoch in range(1, a.epochs + 1):
        stats = algo.run_epoch()
        m = algo.evaluate()
        t0 = time.perf_counter()
        z, y, c = algo.train_eval_set()
        if epoch % a.mi_eval_every == 0 or epoch == a.epochs:
            m["mi_eval"] = mi_eval(z, c, seed=a.seed, steps=a.mi_eval_steps)
            m["mi_eval_cond"] = mi_eval(z, c, seed=a.seed, steps=a.mi_eval_steps, given=y)
        row = {"tag": a.tag, "epoch": epoch, "time_s": round(stats.time_s, 1),
               "eval_s": round(time.perf_counter() - t0, 1), **vars(a),
               **{k: round(v, 4) for k, v in m.items()}}
        row["out"] = str(a.out)
        print(json.dumps(row), flush=True)
        if a.out is not None:
            with a.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
