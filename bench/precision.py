"""The `paper` step at each precision, to choose the preset's: ms per graphed outer step alone
and in bundles, and a few epochs of one trial at each against fp32 twice (the GPU's own
run-to-run spread); the step times go into a piece's costs file (sweeps/piece.py).

    python bench/precision.py --root MNIST                    # one GPU, ~3 minutes
    python bench/precision.py --device cpu --precisions fp32,bf16 --B 1,2 --K 4 \\
        --batch-size 64 --steps 1 --repeats 1 --epochs 1 --slice-rows 2000   # a check

Precisions (unbiased/trial.py, `precision`, names what each trial reports):
- fp32: torch's default (matmul TF32 off; on a GPU cuDNN's TF32 is on: `tf32-conv`);
- tf32: `--tf32` (matmul TF32 too);
- bf16: `--amp` (g's layers in bf16);
- bf16+tf32: both.
The step is outer_step.py's (the paper preset's, on --root's digits or the embedded ones; the
data do not change a step's cost); the slice is the
paper preset's trial (sigma .03, seed 0, lam 1, graphed on a GPU) through run_trial, its
critics shortened (`--mi-eval-steps`: the slice compares training). Writes
REPORT/precision_<device>.md and .csv, and with --costs the step times into that costs file
under each precision's name (the other entries kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))

import outer_step  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from unbiased.benchmarks import benchmark_spec  # noqa: E402
from unbiased.trial import MemorySession, precision, run_trial  # noqa: E402

PRECISIONS = {"fp32": {}, "tf32": {"tf32": True}, "bf16": {"amp": True},
              "bf16+tf32": {"amp": True, "tf32": True}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--root", help="full MNIST (the slices' data); default: the embedded digits")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--B", default="1,7,21", help="bundle sizes of the step, comma-separated")
    p.add_argument("--K", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="epochs of each slice (0: none)")
    p.add_argument("--mi-eval-steps", type=int, default=300)
    p.add_argument("--slice-rows", type=int, default=0,
                   help="train on the first N digits only (0: all; a CPU check)")
    p.add_argument("--report", type=Path, default=ROOT / "bench" / "results" / "gpu")
    p.add_argument("--costs", type=Path, help="a piece's costs file to write step times into")
    args = p.parse_args(argv)
    unknown = sorted(set(args.precisions.split(",")) - set(PRECISIONS))
    if unknown:
        p.error(f"--precisions: unknown {', '.join(unknown)} (choose from "
                f"{', '.join(PRECISIONS)})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (try --device cpu)")
    return args


def set_precision(settings: dict, device: torch.device) -> str:
    """torch's flags as a trial of `settings` sets them (unbiased/trial.py, start_trial);
    the precision it reports."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bool(settings.get("tf32", False))
        torch.backends.cudnn.allow_tf32 = True
    return precision(settings, device)


def step_rows(args: argparse.Namespace, name: str, device: torch.device) -> list[dict]:
    """outer_step.py's graphed rows (eager on a CPU) at one precision."""
    from unbiased.benchmarks.digits.data import build, load_grey_digits

    settings = PRECISIONS[name]
    reported = set_precision(settings, device)
    digits = load_grey_digits("mnist" if args.root else "mnist5k", args.root)
    bench = build(digits, 0.03, seed=0, device=device)
    cfg = dict(batch_size=args.batch_size, K=args.K, lr=1e-4, mine_lr=1e-4, inner_z="batch",
               theta_update="separate", mine_ema_rate=0.01, mine_standardize=True,
               mi_guard=True, amp=bool(settings.get("amp")))
    train = bench.train
    rows = torch.arange(args.batch_size, device=device) % len(train)
    batch = (train.x[rows], train.y[rows], train.c[rows])
    graphs = device.type == "cuda"
    kind = "graphed" if graphs else "eager"
    out = []
    for size in [int(b) for b in args.B.split(",")]:
        row = outer_step._bundle_row(kind, size, bench, cfg, graphs, batch, device, args)
        out.append({"setting": name, "reported": reported, **row})
        print(f"{name}: {row['what']}: " + (row.get("note") or
                                           f"{row['ms']:.1f} ms, {row['ms_per_member']:.2f} "
                                           f"ms a member"), flush=True)
    return out


def slice_rows(args: argparse.Namespace, name: str, run: int, device: torch.device,
               loaded: dict) -> list[dict]:
    """A few epochs of the paper preset's trial at one precision."""
    spec = benchmark_spec("digits")
    preset = spec.presets["paper"]
    config = {k: v for k, v in preset.items()
              if k not in ("sigma", "lam", "seeds", "cpus_per_trial", "gpus_per_trial")}
    config.update(sigma=0.03, lam=1.0, seed=0, epochs=args.epochs, device=str(device),
                  cuda_graphs=device.type == "cuda", num_threads=1,
                  mi_eval_steps=args.mi_eval_steps, **PRECISIONS[name])
    if device.type != "cuda":
        config["source"] = "mnist5k" if not args.root else config["source"]
    session = MemorySession()
    start = time.perf_counter()
    run_trial(config, lambda cfg: _sliced(spec.build(cfg, **loaded), args.slice_rows),
              session)
    wall = time.perf_counter() - start
    out = []
    for report in session.reports:
        out.append({"setting": name, "run": run, "wall_s": wall,
                    **{k: report.get(k) for k in ("epoch", "time_s", "train_acc", "test_acc",
                                                  "mi", "mi_eval", "precision", "graphed")}})
        print(f"{name} slice {run}: epoch {report.get('epoch')}: train {report.get('time_s'):.2f}"
              f" s, test {report.get('test_acc'):.4f}, precision {report.get('precision')}",
              flush=True)
    return out


def _sliced(bench, rows: int):
    if not rows:
        return bench
    from dataclasses import replace

    from unbiased.data import TensorSplit

    t = bench.train
    return replace(bench, train=TensorSplit(t.x[:rows], t.y[:rows], t.c[:rows]))


def write_costs(path: Path, steps: pd.DataFrame, device_name: str) -> None:
    """Each precision's ms per outer step by bundle size into the costs file (kept: the
    other precisions' and the file's other entries)."""
    costs = json.loads(path.read_text()) if path.is_file() else {
        "device": device_name, "settings": {}, "step_ms": {}, "setup_s": 5.0,
        "epoch_s": 0.06, "estimate_s": 2.5}
    if costs.get("device") != device_name:
        print(f"--costs {path}: measured on {costs.get('device')}, this is {device_name}: "
              f"not written", flush=True)
        return
    for reported, part in steps.dropna(subset=["ms"]).groupby("reported"):
        costs["step_ms"][reported] = {str(int(r.members)): round(float(r.ms), 2)
                                      for r in part.itertuples()}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(costs, indent=1) + "\n")
    tmp.replace(path)
    print(f"wrote the step times into {path}")


def report(args, steps: pd.DataFrame, slices: pd.DataFrame, device_name: str) -> str:
    lines = [f"# The paper step at each precision: {device_name}", "",
             f"`python bench/precision.py {' '.join(sys.argv[1:])}`; torch {torch.__version__};"
             f" batch {args.batch_size}, K {args.K}; median of {args.repeats} x {args.steps} "
             f"steps.", "", "| setting | precision | step | ms | ms a member |",
             "|---|---|---|---:|---:|"]
    for r in steps.itertuples():
        ms = "-" if pd.isna(getattr(r, "ms", None)) else f"{r.ms:.1f}"
        per = "-" if pd.isna(getattr(r, "ms_per_member", None)) else f"{r.ms_per_member:.2f}"
        lines.append(f"| {r.setting} | {r.reported} | {r.what} | {ms} | {per} |")
    if not slices.empty:
        lines += ["", f"Slices: sigma .03, seed 0, lam 1, {args.epochs} epochs (fp32 twice: "
                  f"the run-to-run spread). Test accuracy by epoch; training s an epoch after "
                  f"the first.", "", "| setting | run | test accuracy by epoch | s an epoch |",
                  "|---|---:|---|---:|"]
        for (name, run), part in slices.groupby(["setting", "run"], sort=False):
            accs = " / ".join(f"{a:.4f}" for a in part["test_acc"])
            later = part[part["epoch"] > 1]["time_s"]
            secs = f"{statistics.mean(later):.2f}" if len(later) else "-"
            lines.append(f"| {name} | {run} | {accs} | {secs} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    names = args.precisions.split(",")
    steps = pd.DataFrame([row for n in names for row in step_rows(args, n, device)])
    slices = pd.DataFrame()
    if args.epochs:
        spec = benchmark_spec("digits")
        source = "mnist" if args.root else "mnist5k"
        loaded, said = spec.load({"source": source, "root": args.root, "seeds": [0],
                                  "sigma": [0.03]})
        print(f"slices: {said}", flush=True)
        runs = [("fp32", 0), ("fp32", 1), *((n, 0) for n in names if n != "fp32")]
        slices = pd.DataFrame([row for n, run in runs
                               for row in slice_rows(args, n, run, device, loaded)])
    set_precision({}, device)
    text = report(args, steps, slices, name)
    print(text)
    path = outer_step.write_report(args.report, "precision", name, text)
    table = pd.concat([steps.assign(part="step"), slices.assign(part="slice")])
    table.to_csv(path.with_suffix(".csv"), index=False)
    print(f"wrote {path} and {path.with_suffix('.csv')}")
    if args.costs is not None:
        write_costs(args.costs, steps, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
