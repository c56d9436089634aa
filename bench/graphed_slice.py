"""A slice of a digits preset's trials run eager and with `--cuda-graphs`, side by side in one
process: each epoch's metrics and training seconds, so a graphed trial can be compared with
the same trial eager (`--cuda-graphs` on a GPU).

    python bench/graphed_slice.py --root MNIST --device cuda           # the paper preset
    python bench/graphed_slice.py --preset quick --device cpu --epochs 1 --lam 1   # a check

Each trial is `run_trial` (unbiased/trial.py) driven by a recording session, as the
sweep's trial runs under Tune but without Ray, on the preset's settings with this script's
sigma, lam, seed and epochs. `--mi-eval-steps` shortens the stopping rule's critics (the
slice measures training; the critics' cost is gpu_check.py's). Writes OUT (CSV, default
bench/results/gpu/graphed_slice_<device>.csv) and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from unbiased.benchmarks import benchmark_spec  # noqa: E402
from unbiased.trial import MemorySession, run_trial  # noqa: E402

AXES = ("sigma", "lam", "seeds")
DRIVER_ONLY = ("cpus_per_trial", "gpus_per_trial")
COLUMNS = ("epoch", "time_s", "eval_s", "mi_eval_s", "epoch_s", "loss_task", "mi", "train_acc",
           "test_acc", "mi_eval", "mi_eval_cond", "guarded_frac", "graphed", "selected_epoch")


class PrintingSession(MemorySession):
    """A recording session that prints each epoch as it is reported."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        super().report(metrics, checkpoint)
        nan = float("nan")
        print(f"{self.label} epoch {metrics.get('epoch')}: train {metrics.get('time_s', nan):.2f}"
              f" s, mi_eval {metrics.get('mi_eval_s', nan):.1f} s, test "
              f"{metrics.get('test_acc', nan):.4f}, mi {metrics.get('mi', nan):.3f}, mi_eval "
              f"{metrics.get('mi_eval', nan):.3f}, graphed {metrics.get('graphed')}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper")
    p.add_argument("--root", help="full MNIST root (the preset's source)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sigma", type=float, default=0.03)
    p.add_argument("--lam", default="0,1", help="lambda values, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mi-eval-steps", type=int,
                   help="steps of each fresh critic (default: the preset's)")
    p.add_argument("--modes", default="eager,graphed", help="eager, graphed or both")
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def trial_config(args: argparse.Namespace, lam: float, graphs: bool) -> dict:
    preset = benchmark_spec("digits").presets[args.preset]
    config = {k: v for k, v in preset.items() if k not in AXES + DRIVER_ONLY}
    config.update(sigma=args.sigma, lam=lam, seed=args.seed, epochs=args.epochs,
                  device=args.device, cuda_graphs=graphs, num_threads=1)
    if args.mi_eval_steps is not None:
        config["mi_eval_steps"] = args.mi_eval_steps
    if args.root:
        config["root"] = args.root
    return config


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = benchmark_spec("digits")
    first = trial_config(args, 0.0, False)
    loaded, said = spec.load({**first, "seeds": [args.seed], "sigma": [args.sigma]})
    print(f"data: {said}", flush=True)
    rows = []
    for lam in [float(v) for v in args.lam.split(",")]:
        for graphs in [mode == "graphed" for mode in args.modes.split(",")]:
            config = trial_config(args, lam, graphs)
            session = PrintingSession(f"lam {lam:g} {'graphed' if graphs else 'eager'}")
            start = time.perf_counter()
            run_trial(dict(config), lambda cfg: spec.build(cfg, **loaded), session)
            wall = time.perf_counter() - start
            print(f"lam {lam:g} {'graphed' if graphs else 'eager'}: {wall:.1f} s in all",
                  flush=True)
            for report in session.reports:
                rows.append({"lam": lam, "cuda_graphs": graphs, "trial_s": wall,
                             **{k: report.get(k) for k in COLUMNS}})
    frame = pd.DataFrame(rows)
    out = args.out or ROOT / "bench" / "results" / "gpu" / f"graphed_slice_{args.device}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(out)
    later = frame[frame["epoch"] > 1]
    print("\nmean training seconds an epoch after the first (eager / graphed):")
    for lam, part in later.groupby("lam"):
        eager = part[~part["cuda_graphs"]]["time_s"].mean()
        graphed = part[part["cuda_graphs"]]["time_s"].mean()
        print(f"  lam {lam:g}: {eager:.2f} / {graphed:.2f} s ({eager / graphed:.1f}x)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
