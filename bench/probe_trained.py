"""Probe the models a digits sweep trained, from their checkpoints (docs/MEASURED.md, "The same
trained models: random RGB test colours, estimates and their floors").

For every trial of a sweep's Tune directory: its last checkpoint's g and f (and the epoch its
stopping rule selected, when it kept one), on the trial's own data (its sigma, seed, palette):

- test accuracy under the protocol (each test digit gets a random class's palette colour plus
  the trial's noise), and with uniformly random RGB colours instead (every channel U(0, 1)):
  how much of the ERM gap to the published numbers is the test colouring;
- mi_eval and mi_eval_cond on the trial's training rows, and the same estimators on the
  model's one-hot predictions (the stopping rule's floors), over several estimator seeds.

    python bench/probe_trained.py OUT/tune/digits_grid --root ../shared/data/mnist --seeds 3

Prints one row per trial and weights; CPU, one thread. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from unbiased.benchmarks.digits import data as colored_mnist  # noqa: E402
from unbiased.data import TensorSplit  # noqa: E402
from unbiased.methods import make_method  # noqa: E402
from unbiased.mine import mi_eval  # noqa: E402
from unbiased.trial import CHECKPOINT_FILE  # noqa: E402


def random_rgb_test(grey: torch.Tensor, y: torch.Tensor, seed: int) -> TensorSplit:
    """The test digits coloured with uniformly random RGB colours."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    colours = torch.rand(len(y), 3, generator=gen)
    x = colored_mnist.colourise(grey, colours)
    return TensorSplit(x, y, colored_mnist.colour_attribute(x.amax(dim=(2, 3))))


def accuracy(algo, split) -> float:
    _, logits = algo.outputs(split)
    return float((logits.argmax(1) == split.y).float().mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiment", type=Path, help="a sweep's OUT/tune/<experiment> directory")
    p.add_argument("--root", help="MNIST root of the sweep (source mnist)")
    p.add_argument("--seeds", type=int, default=3, help="estimator seeds per estimate")
    p.add_argument("--steps", type=int, default=1000, help="mi_eval steps")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    trials = sorted(d for d in args.experiment.iterdir() if (d / "params.json").is_file())
    digits_cache: dict[str, colored_mnist.GreyDigits] = {}
    print("sigma lam seed weights epoch | test_acc palette / random RGB | "
          "mi_eval (floor) | mi_eval_cond (floor_cond), mean over estimator seeds")
    for trial in trials:
        ckpts = sorted(trial.glob("checkpoint_*"))
        if not ckpts:
            continue
        config = json.loads((trial / "params.json").read_text())
        config = {**{k: v for k, v in config.items() if k != "point"}, **config["point"]}
        source = str(config.get("source", "mnist5k"))
        if source not in digits_cache:
            digits_cache[source] = colored_mnist.load_grey_digits(source, args.root)
        digits = digits_cache[source]
        bench = colored_mnist.build(digits, float(config["sigma"]), int(config["seed"]),
                                    z_relu=bool(config.get("z_relu", False)),
                                    width=int(config.get("width", 64)),
                                    palette=str(config.get("palette", "separated")))
        state = torch.load(ckpts[-1] / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
        algo = make_method(str(config.get("method", "mi_backprop")), bench, config,
                           seed=int(config["seed"]))
        versions = {"last": (int(state["epoch"]), state["g"], state["f"])}
        if "selected" in state:
            sel = state["selected"]
            versions["selected"] = (int(sel["epoch"]), sel["g"], sel["f"])
        rgb = random_rgb_test(digits.test_x, digits.test_y, int(config["seed"]))
        for name, (epoch, g, f) in versions.items():
            with algo.at_weights(g, f):
                palette_acc = accuracy(algo, algo.bench.eval_splits["test_acc"])
                rgb_acc = accuracy(algo, rgb)
                z, y, c = algo.train_eval_set()
                pred = algo.predictions(z)
                est = {k: [] for k in ("mi", "floor", "cond", "floor_cond")}
                for s in range(args.seeds):
                    est["mi"].append(mi_eval(z, c, seed=s, steps=args.steps))
                    est["floor"].append(mi_eval(pred, c, seed=s, steps=args.steps))
                    est["cond"].append(mi_eval(z, c, seed=s, steps=args.steps, given=y))
                    est["floor_cond"].append(mi_eval(pred, c, seed=s, steps=args.steps,
                                                     given=y))
            t = {k: torch.tensor(v) for k, v in est.items()}
            print(f"{config['sigma']} {config['lam']} {config['seed']} {name} {epoch} | "
                  f"{palette_acc:.3f} / {rgb_acc:.3f} | "
                  f"{t['mi'].mean():.2f}±{t['mi'].std():.2f} ({t['floor'].mean():.2f}) | "
                  f"{t['cond'].mean():.2f}±{t['cond'].std():.2f} "
                  f"({t['floor_cond'].mean():.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
