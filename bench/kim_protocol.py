"""Kim et al.'s own Colored MNIST protocol (unbiased/kim_protocol.py): their baseline, then
LNTL fine-tuned from it, per sigma, beside the numbers in their README.

    .venv/bin/python bench/kim_protocol.py --root ../shared/data/mnist --sigma 0.03,0.02 \\
        --device cuda --parallel --max-minutes 3.6 --out bench/results/kim_protocol

Writes, under --out: epochs.csv (one row per sigma / phase / epoch, rewritten atomically
after every epoch), summary.md (final test accuracies beside Kim's README) and curves.png
(test accuracy by epoch), the last two after every phase. Without --root it runs on the
embedded 5,000-digit subset (4,000 train / 1,000 test), for smoke runs only.

--stop-flat N ends the fine-tune once the test curve has been flat for N epochs: no epoch in
the last N beat the reference by more than --flat-tol, the reference being the test accuracy
of the last epoch that did (unbiased.kim_protocol.FlatStop). --max-minutes stops between
epochs when the next epoch (estimated from the last one) would overrun, skips phases that
cannot fit an epoch, and writes what it has.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLUMNS = ("sigma", "seed", "phase", "epoch", "lr", "head_lr", "train_loss", "train_acc",
           "test_loss", "test_acc", "neg_entropy", "head_loss", "head_acc", "train_s",
           "epoch_s", "elapsed_s")
# A fine-tune epoch costs about this many baseline epochs (two forwards of the network, two
# of the heads, two backwards): used only to decide whether one still fits --max-minutes.
LNTL_COST = 3.5
# Seconds kept for writing the outputs at the end (a process's own; --parallel's merge).
RESERVE_S = 5.0
MERGE_RESERVE_S = 15.0
CHILD_ENV = "KIM_PROTOCOL_CHILD"


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise UsageError(message)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--root", help="full MNIST in torchvision's layout (MNIST/raw under it); "
                                  "without it the embedded 5,000-digit subset")
    p.add_argument("--sigma", default="0.03", help="comma list of colour variances")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--baseline-epochs", type=int, default=100, help="Kim: 100 (option.py)")
    p.add_argument("--finetune-epochs", type=int, default=100,
                   help="Kim: 100 (option.py, train.sh); test.sh evaluates epoch 91")
    p.add_argument("--stop-flat", type=int, default=10,
                   help="stop the fine-tune after N flat epochs (0: never)")
    p.add_argument("--flat-tol", type=float, default=0.002)
    p.add_argument("--max-minutes", type=float, help="stop cleanly within this wall time")
    p.add_argument("--palette", default="kim")
    p.add_argument("--stroke", default="flat")
    p.add_argument("--n-train", type=int, default=0,
                   help="use only the first N training digits (0: all), for smoke runs")
    p.add_argument("--fresh-momentum", action="store_true",
                   help="do not load the baseline's optimizer state into the fine-tune "
                        "(Kim's resume does)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 convs on CUDA (default: "
                                                       "full fp32)")
    p.add_argument("--parallel", action="store_true",
                   help="run each sigma in its own process at once (same device; the GPU "
                        "step is launch-bound, so two processes nearly double throughput); "
                        "each writes DIR/sigma_S/, merged into DIR/ at the end")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        a.sigmas = [float(s) for s in a.sigma.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--sigma must be a comma list of numbers, got {a.sigma!r}") from None
    if not a.sigmas or not all(0 < s < 1 for s in a.sigmas):
        raise UsageError(f"--sigma values must be in (0, 1), got {a.sigma!r}")
    if len(set(a.sigmas)) != len(a.sigmas):
        raise UsageError(f"--sigma lists a value twice: {a.sigma!r}")
    if a.baseline_epochs < 1:
        raise UsageError(f"--baseline-epochs must be >= 1, got {a.baseline_epochs}")
    if a.finetune_epochs < 0:
        raise UsageError(f"--finetune-epochs must be >= 0, got {a.finetune_epochs}")
    if a.stop_flat < 0:
        raise UsageError(f"--stop-flat must be >= 0, got {a.stop_flat}")
    if not a.flat_tol >= 0:
        raise UsageError(f"--flat-tol must be >= 0, got {a.flat_tol}")
    if a.max_minutes is not None and not (a.max_minutes > 0 and math.isfinite(a.max_minutes)):
        raise UsageError(f"--max-minutes must be > 0, got {a.max_minutes}")
    if a.n_train < 0:
        raise UsageError(f"--n-train must be >= 0, got {a.n_train}")
    if a.root is not None and not Path(a.root).expanduser().is_dir():
        raise UsageError(f"--root {a.root} is not a directory")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        raise UsageError(f"--out {a.out} exists and is not a directory")
    return a


def read_csv(path: Path) -> list[dict]:
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            row: dict = {}
            for k, v in r.items():
                if k == "phase":
                    row[k] = v
                elif k in ("seed", "epoch"):
                    row[k] = int(v)
                elif v != "":
                    row[k] = float(v)
            rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, path)


def kim_row(sigma: float) -> tuple[float, float] | None:
    from unbiased.kim_protocol import KIM_README

    return KIM_README.get(round(sigma, 3))


def summary(a: argparse.Namespace, rows: list[dict], notes: dict[float, list[str]],
            header: list[str]) -> str:
    from unbiased.kim_protocol import KIM_EVAL_EPOCH

    def fmt(v):
        return "-" if v is None else f"{v:.4f}"

    lines = ["# Kim et al.'s protocol on our Colored MNIST", "", *header, "",
             "| sigma | baseline (epochs) | LNTL final (epochs) | LNTL at epoch "
             f"{KIM_EVAL_EPOCH} | LNTL best (epoch) | Kim baseline | Kim LNTL |",
             "|---|---|---|---|---|---|---|"]
    for sigma in a.sigmas:
        base = [r for r in rows if r["sigma"] == sigma and r["phase"] == "baseline"]
        lntl = [r for r in rows if r["sigma"] == sigma and r["phase"] == "lntl"]
        if not base:
            continue
        kim = kim_row(sigma)
        at = [r["test_acc"] for r in lntl if r["epoch"] == KIM_EVAL_EPOCH]
        best = max(lntl, key=lambda r: r["test_acc"]) if lntl else None
        lines.append(
            f"| {sigma:.3f} | {base[-1]['test_acc']:.4f} ({len(base)}) | "
            + (f"{lntl[-1]['test_acc']:.4f} ({len(lntl)})" if lntl else "-") + " | "
            + fmt(at[0] if at else None) + " | "
            + (f"{best['test_acc']:.4f} ({best['epoch']})" if best else "-") + " | "
            + (f"{kim[0]:.4f} | {kim[1]:.4f} |" if kim else "- | - |"))
    lines += ["", "Kim's columns: their README's table (feidfoe/learning-not-to-learn). "
              "'LNTL best' selects on the test split: optimistic, shown only to read the "
              "curve.", ""]
    for sigma in a.sigmas:
        for note in notes.get(sigma, []):
            lines.append(f"- sigma {sigma:.3f}: {note}")
    return "\n".join(lines) + "\n"


def plot(path: Path, a: argparse.Namespace, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sigmas = [s for s in a.sigmas if any(r["sigma"] == s for r in rows)]
    if not sigmas:
        return
    fig, axes = plt.subplots(1, len(sigmas), figsize=(5.5 * len(sigmas), 4), squeeze=False)
    for ax, sigma in zip(axes[0], sigmas, strict=True):
        base = [r for r in rows if r["sigma"] == sigma and r["phase"] == "baseline"]
        lntl = [r for r in rows if r["sigma"] == sigma and r["phase"] == "lntl"]
        nb = len(base)
        ax.plot([r["epoch"] for r in base], [r["test_acc"] for r in base], label="baseline test")
        ax.plot([r["epoch"] for r in base], [r["train_acc"] for r in base], lw=0.8, alpha=0.6,
                label="baseline train")
        if lntl:
            ax.plot([nb + r["epoch"] for r in lntl], [r["test_acc"] for r in lntl],
                    label="LNTL test")
            ax.plot([nb + r["epoch"] for r in lntl], [r["train_acc"] for r in lntl], lw=0.8,
                    alpha=0.6, label="LNTL train")
        kim = kim_row(sigma)
        if kim:
            ax.axhline(kim[0], ls="--", color="C0", lw=0.8, label="Kim baseline (README)")
            ax.axhline(kim[1], ls="--", color="C2", lw=0.8, label="Kim LNTL (README)")
        ax.axvline(nb + 0.5, color="grey", lw=0.5)
        ax.set_title(f"sigma {sigma:.3f}")
        ax.set_xlabel("epoch (baseline, then fine-tune)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.01)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def child_argv(a: argparse.Namespace, sigma: float, out: Path, minutes: float | None
               ) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--sigma", repr(sigma),
            "--out", str(out), "--seed", str(a.seed), "--device", a.device,
            "--baseline-epochs", str(a.baseline_epochs),
            "--finetune-epochs", str(a.finetune_epochs), "--stop-flat", str(a.stop_flat),
            "--flat-tol", repr(a.flat_tol), "--palette", a.palette, "--stroke", a.stroke,
            "--n-train", str(a.n_train)]
    if a.root is not None:
        argv += ["--root", a.root]
    if minutes is not None:
        argv += ["--max-minutes", repr(minutes)]
    return argv + (["--fresh-momentum"] if a.fresh_momentum else []) + \
        (["--tf32"] if a.tf32 else [])


def run_parallel(a: argparse.Namespace, start: float) -> int:
    """One child process per sigma, then their outputs merged into --out."""
    import subprocess

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # The children's own budget leaves the merge a few seconds.
    minutes = None if a.max_minutes is None else max(a.max_minutes - MERGE_RESERVE_S / 60,
                                                     a.max_minutes / 2)
    dirs = {s: out / f"sigma_{s:.3f}" for s in a.sigmas}
    env = {**os.environ, CHILD_ENV: "1"}
    procs = {s: subprocess.Popen(child_argv(a, s, d, minutes), env=env)
             for s, d in dirs.items()}
    codes = {s: p.wait() for s, p in procs.items()}
    rows: list[dict] = []
    notes: dict[float, list[str]] = {}
    header: list[str] = []
    for s, d in dirs.items():
        if (d / "epochs.csv").exists():
            rows += read_csv(d / "epochs.csv")
        if (d / "run.json").exists():
            info = json.loads((d / "run.json").read_text())
            header = header or info["header"]
            notes[s] = info["notes"].get(repr(s), [])
        if codes[s] != 0:
            notes.setdefault(s, []).append(f"process exited {codes[s]}")
    write_csv(out / "epochs.csv", rows)
    (out / "summary.md").write_text(summary(a, rows, notes, header))
    plot(out / "curves.png", a, rows)
    print(f"wrote {out / 'epochs.csv'}, {out / 'summary.md'}, {out / 'curves.png'} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    print((out / "summary.md").read_text(), flush=True)
    return max(codes.values())


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    if a.parallel and len(a.sigmas) > 1:
        return run_parallel(a, start)
    budget = None if a.max_minutes is None else 60 * a.max_minutes - RESERVE_S

    import torch

    from unbiased.benchmarks import colored_mnist as cm
    from unbiased.data import DataError, TensorSplit
    from unbiased.kim_protocol import (
        FlatStop,
        KimConfig,
        finetune_lntl,
        set_fp32_precision,
        train_baseline,
    )

    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    if a.palette not in cm.PALETTES or a.stroke not in cm.STROKES:
        print(f"error: --palette must be one of {sorted(cm.PALETTES)} and --stroke one of "
              f"{cm.STROKES}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if a.device == "cuda" or (
        a.device == "auto" and torch.cuda.is_available()) else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {device} ({name}), torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}", flush=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        set_fp32_precision(a.tf32)
    try:
        digits = cm.load_grey_digits("mnist" if a.root else "mnist5k", a.root)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = KimConfig(resume_optimizer=not a.fresh_momentum)
    header = [f"- data: {'full MNIST' if a.root else 'embedded 5k subset'}"
              + (f", first {a.n_train} training digits" if a.n_train else "")
              + f", palette {a.palette}, stroke {a.stroke}, seed {a.seed}",
              f"- device {device} ({name}), torch {torch.__version__}"
              + (", TF32 allowed" if a.tf32 else ", fp32"),
              f"- baseline: lr {cfg.baseline_lr}, {a.baseline_epochs} epochs; LNTL: lr "
              f"{cfg.finetune_lr}, lam {cfg.lam}, mu {cfg.mu}, up to {a.finetune_epochs} "
              f"epochs, stop after {a.stop_flat} flat epochs (tol {a.flat_tol}); optimizer "
              f"state {'fresh' if a.fresh_momentum else 'resumed from the baseline'}; "
              f"SGD momentum {cfg.momentum}, weight decay {cfg.weight_decay}, batch "
              f"{cfg.batch_size}, lr x{cfg.lr_decay_rate} every {cfg.lr_decay_period} epochs"]
    rows: list[dict] = []
    notes: dict[float, list[str]] = {}
    last_epoch_s = {"baseline": None}

    def elapsed() -> float:
        return time.perf_counter() - start

    def fits(seconds: float | None) -> bool:
        return budget is None or seconds is None or elapsed() + seconds <= budget

    def write() -> None:
        write_csv(out / "epochs.csv", rows)
        (out / "summary.md").write_text(summary(a, rows, notes, header))
        # For --parallel's merge.
        (out / "run.json").write_text(json.dumps(
            {"header": header, "notes": {repr(s): n for s, n in notes.items()}}))
        plot(out / "curves.png", a, rows)

    def callback(sigma: float, total: int, flat: FlatStop | None):
        def cb(m: dict) -> bool:
            m.update(sigma=sigma, seed=a.seed, elapsed_s=elapsed())
            rows.append(m)
            write_csv(out / "epochs.csv", rows)
            extra = ""
            if m["phase"] == "lntl":
                extra = (f" heads {m['head_loss']:.3f} negent {m['neg_entropy']:.3f} "
                         f"head_acc {m['head_acc']:.3f}")
            print(f"[sigma {sigma:.3f}] {m['phase']:8s} {m['epoch']:3d}/{total} lr "
                  f"{m['lr']:.0e} loss {m['train_loss']:.4f} train_acc {m['train_acc']:.4f} "
                  f"test_acc {m['test_acc']:.4f}{extra} | {m['epoch_s']:.2f} s/epoch "
                  f"({m['train_s']:.2f} train), {elapsed():.0f} s", flush=True)
            last_epoch_s[m["phase"]] = m["epoch_s"]
            if flat is not None and flat(m["test_acc"]):
                notes.setdefault(sigma, []).append(
                    f"LNTL stopped at epoch {m['epoch']}: flat for {a.stop_flat} epochs")
                return True
            if not fits(m["epoch_s"]):
                notes.setdefault(sigma, []).append(
                    f"{m['phase']} stopped at epoch {m['epoch']} of {total}: --max-minutes")
                return True
            return False
        return cb

    for sigma in a.sigmas:
        est = last_epoch_s["baseline"]
        if not fits(est):
            notes.setdefault(sigma, []).append("not run: --max-minutes")
            print(f"[sigma {sigma:.3f}] skipped: no time left", flush=True)
            continue
        bench = cm.build(digits, sigma, a.seed, device=device, palette=a.palette,
                         stroke=a.stroke)
        train, test = bench.train, bench.eval_splits["test_acc"]
        if a.n_train:
            train = TensorSplit(train.x[:a.n_train], train.y[:a.n_train], train.c[:a.n_train])
        print(f"[sigma {sigma:.3f}] {len(train)} train / {len(test)} test digits", flush=True)
        base = train_baseline(train, test, device, seed=a.seed, epochs=a.baseline_epochs,
                              cfg=cfg, callback=callback(sigma, a.baseline_epochs, None))
        write()
        if a.finetune_epochs == 0:
            continue
        est = last_epoch_s["baseline"] * LNTL_COST
        if not fits(est):
            notes.setdefault(sigma, []).append("LNTL not run: --max-minutes")
            print(f"[sigma {sigma:.3f}] LNTL skipped: no time left", flush=True)
            continue
        flat = FlatStop(a.stop_flat, a.flat_tol) if a.stop_flat else None
        finetune_lntl(base.net, train, test, device, seed=a.seed, epochs=a.finetune_epochs,
                      cfg=cfg, optimizer_state=base.optimizer_state,
                      callback=callback(sigma, a.finetune_epochs, flat))
        write()
        del base, bench, train, test
    write()
    if not os.environ.get(CHILD_ENV):
        print(f"wrote {out / 'epochs.csv'}, {out / 'summary.md'}, {out / 'curves.png'} "
              f"({elapsed():.0f} s)", flush=True)
        print((out / "summary.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
