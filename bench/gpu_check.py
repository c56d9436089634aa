"""`make gpu-check`: what a GPU must show before the paper grid goes on a GPU cluster.

    python bench/gpu_check.py --root DATA        # needs CUDA; ~5 minutes on one GPU
    python bench/gpu_check.py --root DATA --epochs 2 --report /tmp/gpu

1. The CUDA-only tests (tests/test_gpu.py, the cuda pairs of tests/test_restore_devices.py).
2. A slice of the `paper` preset as its sweep runs it: sigma .030 and .045 x lambda 0 and 1,
   seed 0, four trials packed on the GPU at 0.25 each, `--epochs` epochs, the stopping rule's
   re-estimate every epoch (to measure its cost). GPU memory and utilisation are sampled by
   nvidia-smi while it runs. After a trial's first epoch one trial process is killed
   (SIGKILL, as a spot reclaim would): Tune restores it from its checkpoint, and every
   trial must report every epoch exactly once. With a `--cuda-graphs` preset (`paper`) every
   epoch must have replayed its graph (`graphed`): a trial that ran eager fails the check.
3. The paper preset's outer step alone and in trial bundles of 1, 3, 7, 21, 63 members
   (bench/outer_step.py): ms per step, kernels per step, peak memory, projected grid time.
4. A report, REPORT/<device>.md (default bench/results/gpu/): seconds per epoch and their
   parts, the re-estimate's share of an epoch and of a `paper` trial at its `mi_eval_every`,
   GPU memory and utilisation, the restore, the projected GPU time of the paper grid, and
   the outer-step table (also REPORT/outer_step_<device>.md).

Without CUDA it prints one `error:` line and exits 2. Exit 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

SIGMAS, LAMS = "0.03,0.045", "0,1"
CUDA_TESTS = ["tests/test_gpu.py", "tests/test_restore_devices.py"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", help="full MNIST root (default: the preset's, downloaded there "
                                  "when missing)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the paper-preset slice")
    p.add_argument("--report", type=Path, default=ROOT / "bench" / "results" / "gpu",
                   help="folder of the report (<device>.md)")
    p.add_argument("--out", type=Path, help="the slice's sweep folder (default: a temporary one)")
    p.add_argument("--skip-tests", action="store_true", help="the slice and report only")
    p.add_argument("--skip-steps", action="store_true",
                   help="no outer-step table (bench/outer_step.py)")
    p.add_argument("--preset", default="paper", help="the preset the slice runs")
    p.add_argument("--extra", default="", help="more flags for the slice's driver, e.g. "
                                               "'--inner-z fresh' or '--deterministic'")
    a = p.parse_args(argv)
    if a.epochs < 2:
        p.error("argument --epochs: at least 2 (one trial is killed after its first)")
    return a


def device_facts() -> dict[str, str]:
    import torch

    props = torch.cuda.get_device_properties(0)
    facts = {"device": torch.cuda.get_device_name(0),
             "memory": f"{props.total_memory / 2**30:.0f} GiB",
             "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
             "multiprocessors": str(props.multi_processor_count),
             "torch": torch.__version__, "cuda": str(torch.version.cuda),
             "cudnn": str(torch.backends.cudnn.version()), "python": sys.version.split()[0]}
    try:
        import ray

        facts["ray"] = ray.__version__
    except ImportError:
        facts["ray"] = "not installed"
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    facts["driver"] = smi.strip().splitlines()[0] if smi.strip() else "unknown"
    facts["cpus"] = str(os.cpu_count())
    return facts


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_tests() -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-s", *CUDA_TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    print(proc.stdout, proc.stderr[-3000:], sep="\n", flush=True)
    summary = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)",
                                                                      line)]
    notes = [line.strip() for line in proc.stdout.splitlines()
             if line.startswith("default mode repeats")]
    return proc.returncode, "; ".join(summary[-1:] + notes)


class GpuSampler:
    """nvidia-smi's utilisation (%) and memory used (MiB) twice a second while it runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits", "-lms", "500"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)


def trial_pids() -> list[int]:
    """The processes of running Tune function trials (Ray titles them ray::ImplicitFunc)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if cmd.startswith("ray::ImplicitFunc"):
            pids.append(int(cmdline.parent.name))
    return sorted(pids)


def checkpointed_pid(out: Path, wait_s: float = 15.0) -> int | None:
    """The process of a trial that has reported (and so checkpointed) an epoch, from the
    `pid` Tune records with each result; None when none shows up in time."""
    running = set(trial_pids())
    deadline = time.time() + wait_s
    while time.time() < deadline:
        for path in sorted(out.glob("tune/*/*/result.json")):
            for line in path.read_text().splitlines():
                try:
                    pid = int(json.loads(line).get("pid", -1))
                except ValueError:
                    continue
                if pid in running:
                    return pid
        time.sleep(0.5)
    return None


def run_slice(args: argparse.Namespace, out: Path) -> tuple[int, list[str], dict]:
    """The paper-preset slice; its exit status, its output lines and what the kill did."""
    cmd = [sys.executable, str(ROOT / "sweeps" / "digits_grid.py"), "--preset", args.preset,
           *(["--root", args.root] if args.root else []), "--sigma", SIGMAS, "--lam", LAMS,
           "--seeds", "0", "--epochs", str(args.epochs), "--mi-eval-every", "1", "--out", str(out),
           "--overwrite", *args.extra.split()]
    print("slice: " + " ".join(cmd), flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, kill = [], {"killed_pid": None, "at": None}
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
        if kill["killed_pid"] is None and re.search(r": epoch 1/\d+", line):
            pid = checkpointed_pid(out)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)  # as a spot reclaim: no warning, no cleanup
                kill.update(killed_pid=pid, at=line.split("]")[0] + "]",
                            trials_running=len(trial_pids()))
                print(f"gpu-check: killed trial process {pid} after its first epoch",
                      flush=True)
            else:
                kill["killed_pid"] = 0  # looked once; the report says none was found
    proc.wait()
    return proc.returncode, lines, kill


def reported_epochs(out: Path) -> dict[str, list[int]]:
    """Each trial's epochs as Tune recorded its reports (a re-reported epoch shows twice), for
    the trials of OUT/results.parquet."""
    import pandas as pd

    ids = set(pd.read_parquet(out / "results.parquet")["trial_id"].astype(str))
    epochs: dict[str, list[int]] = {}
    for path in sorted(out.glob("tune/*/*/result.json")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not rows or str(rows[-1].get("trial_id")) not in ids:
            continue  # an earlier run's trial in the same folder
        point = (rows[-1].get("config") or {}).get("point") or {}
        tag = f"sigma {point.get('sigma')} lam {point.get('lam')}"
        epochs[tag] = [int(r["epoch"]) for r in rows if "epoch" in r]
    return epochs


def _fmt(value: float, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.{digits}f}"


def summarise(out: Path, epochs: int) -> tuple[list[str], dict]:
    import pandas as pd

    from unbiased.benchmarks.digits.spec import DIGITS

    df = pd.read_parquet(out / "results.parquet")
    paper = DIGITS["paper"]
    every, paper_epochs = int(paper["mi_eval_every"]), int(paper["epochs"])
    lines = ["| sigma | lam | epochs | restored from | s/epoch | train s | eval s | "
             "re-estimate s | test acc (last) | status |", "|---" * 10 + "|"]
    per_lam: dict[float, dict[str, float]] = {}
    restored_trials: list[str] = []
    for (sigma, lam), rows in df.groupby(["sigma", "lam"]):
        rows = rows.sort_values("epoch")
        later = rows[rows["epoch"] > 1]  # epoch 1 also pays CUDA start-up and cuDNN tuning
        starts = sorted(set(int(s) for s in rows["start_epoch"].dropna()))
        restored = ", ".join(f"epoch {s}" for s in starts if s > 1) or "-"
        if restored != "-":
            restored_trials.append(f"sigma {sigma:g} lam {lam:g}")
        lines.append(f"| {sigma:.3f} | {lam:g} | {len(rows)} | {restored} | "
                     f"{_fmt(later['epoch_s'].mean())} | {_fmt(later['time_s'].mean())} | "
                     f"{_fmt(later['eval_s'].mean())} | {_fmt(later['mi_eval_s'].mean())} | "
                     f"{_fmt(rows['test_acc'].iloc[-1], 3)} | {rows['status'].iloc[-1]} |")
        got = per_lam.setdefault(float(lam), {"rest_s": [], "critic_s": 0.0, "critics": 0})
        got["rest_s"] += list(later["epoch_s"] - later["mi_eval_s"])
        if lam > 0:  # 4 fresh critics an epoch, 2 more at the last (the chosen epoch again)
            critics = [6 if e == epochs else 4 for e in later["epoch"]]
            got["critic_s"] += float(later["mi_eval_s"].sum())
            got["critics"] += sum(critics)
    critics = sum(g["critics"] for g in per_lam.values())
    facts: dict = {"every": every, "paper_epochs": paper_epochs, "restored": restored_trials,
                   "critic_s": sum(g["critic_s"] for g in per_lam.values()) / critics
                   if critics else math.nan}
    for lam, got in per_lam.items():
        facts[lam] = {"rest_s": sum(got["rest_s"]) / len(got["rest_s"])}
    # Whether every epoch of every trial replayed its graph (--cuda-graphs).
    facts["graphed"] = "graphed" in df and bool(df["graphed"].fillna(False).astype(bool).all())
    return lines, facts


def projection(facts: dict) -> list[str]:
    """The paper grid's GPU time from the slice's seconds (4 trials on one GPU as measured)."""
    from unbiased.benchmarks.digits.spec import DIGITS

    paper = DIGITS["paper"]
    every, epochs = facts["every"], facts["paper_epochs"]
    n_sigma, n_seed = len(paper["sigma"]), len(paper["seeds"])
    lams = [float(v) for v in paper["lam"]]
    critic = facts["critic_s"]  # one fresh critic (mi_eval_steps steps) as measured
    lines = [f"One fresh critic of the stopping rule: {critic:.2f} s; a re-estimate is 4 of "
             f"them (mi_eval, mi_eval_cond and their prediction floors), the chosen epoch's "
             f"2 again at the end. Per trial: epochs x (train + evaluation s) + re-estimates "
             f"x 4 critics + 2 critics; ERM (lam 0) estimates at its last epoch only (2)."]
    total = 0.0
    for lam in lams:
        measured = facts.get(lam) or facts.get(1.0 if lam > 0 else 0.0)
        if measured is None or math.isnan(critic):
            continue
        rest = measured["rest_s"]
        if lam == 0:
            trial = epochs * rest + 2 * critic
            how = "re-estimated once, at its last epoch"
        else:
            estimates = epochs // every
            trial = epochs * rest + estimates * 4 * critic + 2 * critic
            share = (estimates * 4 + 2) * critic / trial
            share_every = (epochs * 4 + 2) * critic / (epochs * rest + (epochs * 4 + 2) * critic)
            how = (f"re-estimated every {every} epochs ({estimates} times): {share:.0%} of the "
                   f"trial (every epoch: {share_every:.0%})")
        total += trial * n_sigma * n_seed
        lines.append(f"- lam {lam:g}: {trial / 60:.1f} min a trial ({epochs} epochs x "
                     f"{rest:.2f} s); {how}")
    lines.append(f"- the grid: {n_sigma} sigmas x {len(lams)} lambdas x {n_seed} seeds = "
                 f"{n_sigma * len(lams) * n_seed} trials, {total / 3600:.1f} trial-hours at the "
                 f"speed measured with 4 trials sharing a GPU: {total / 3600 / 4:.1f} h on one "
                 f"such GPU (4 trials at a time), {total / 3600 / 16:.1f} h on four")
    return lines


def run_outer_steps(args: argparse.Namespace) -> tuple[int, str]:
    """bench/outer_step.py on this GPU: its exit status and its table (as markdown)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "outer_step.py"), "--device",
                           "cuda", "--report", str(args.report)], cwd=ROOT,
                          capture_output=True, text=True)
    text = proc.stdout.strip()
    table = [line for line in text.splitlines() if line.startswith("|")]
    if proc.returncode != 0 or not table:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return proc.returncode or 1, f"failed (exit {proc.returncode}): {tail}"
    return 0, "\n".join(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        print(f"error: gpu-check needs a CUDA GPU, and torch {torch.__version__} ({build}) "
              f"sees none on this machine", file=sys.stderr)
        return 2
    start = time.time()
    facts = device_facts()
    print("gpu-check on " + ", ".join(f"{k} {v}" for k, v in facts.items()), flush=True)
    failed = []
    tests = "skipped (--skip-tests)"
    if not args.skip_tests:
        code, tests = run_tests()
        if code != 0:
            failed.append("CUDA tests")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "slice"
        with GpuSampler() as sampler:
            slice_start = time.time()
            code, lines, kill = run_slice(args, out)
            slice_s = time.time() - slice_start
        if code != 0:
            failed.append(f"the slice (exit {code})")
        table, measured = summarise(out, args.epochs) if (out / "results.parquet").is_file() \
            else (["no results.parquet: " + (lines[-1] if lines else "no output")], {})
        reported = reported_epochs(out)
    steps = "skipped (--skip-steps)"
    if not args.skip_steps:
        code, steps = run_outer_steps(args)
        if code != 0:
            failed.append("the outer-step table")
    wanted = list(range(1, args.epochs + 1))
    once = {tag: sorted(ep) == wanted for tag, ep in reported.items()}
    restored = measured.get("restored", [])
    if len(reported) != 4 or not all(once.values()):
        failed.append("every epoch exactly once")
    from unbiased.benchmarks.digits.spec import DIGITS

    if DIGITS.get(args.preset, {}).get("cuda_graphs") and not measured.get("graphed"):
        failed.append("a trial of a --cuda-graphs preset ran eager (its log says why)")
    if not kill["killed_pid"]:
        failed.append("no trial process was found to kill")
    elif not restored:
        failed.append("the killed trial was not restored from its checkpoint")
    util = [u for u, _ in sampler.samples]
    mem = [m for _, m in sampler.samples]
    slug = re.sub(r"[^a-z0-9]+", "-", facts["device"].lower()).strip("-")
    report = [
        f"# gpu-check on {facts['device']}", "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `make gpu-check` "
        f"(bench/gpu_check.py), {time.time() - start:.0f} s in all. " + ", ".join(
            f"{k} {v}" for k, v in facts.items() if k != "device") + ".", "",
        "## CUDA-only tests", "", f"{' '.join(CUDA_TESTS)}: {tests}", "",
        f"## `{args.preset}` preset slice: sigma {SIGMAS} x lambda {LAMS}, seed 0, {args.epochs} "
        f"epochs, 0.25 GPU and 1 CPU a trial, re-estimating every epoch", "",
        f"{slice_s:.0f} s for the four trials side by side (Ray start and data loading "
        "included). Seconds are means over epochs 2 on (epoch 1 pays CUDA's start-up); "
        "`re-estimate` is the stopping rule's four fresh critics (mi_eval_s).", "", *table, "",
        f"GPU while the slice ran ({len(util)} nvidia-smi samples): utilisation mean "
        f"{_fmt(sum(util) / len(util) if util else math.nan, 0)}% (max "
        f"{_fmt(max(util) if util else math.nan, 0)}%), memory used max "
        f"{_fmt(max(mem) if mem else math.nan, 0)} MiB.", "",
        "## Killed and restored", "",
        f"After the first `epoch 1` line ({kill.get('at')}) trial process "
        f"{kill['killed_pid']} was killed with SIGKILL ({kill.get('trials_running')} trial "
        f"processes running). Epochs each trial reported, as Tune recorded them:", "",
        *[f"- {tag}: {ep}" for tag, ep in reported.items()], "",
        "Restored from a checkpoint (rows with start_epoch > 1): "
        + (", ".join(restored) or "none"), "",
        "Every epoch exactly once: " + ("yes" if reported and all(once.values()) else "NO"), "",
        "## Projected GPU time of the paper grid (150 epochs, from the seconds above)", "",
        *(projection(measured) if measured else ["no measurement"]), "",
        "## The outer step alone and in trial bundles (bench/outer_step.py)", "", steps, "",
        "Checks failed: " + (", ".join(failed) if failed else "none"), ""]
    from analysis.io import atomic_write_text

    args.report.mkdir(parents=True, exist_ok=True)
    path = args.report / f"{slug}.md"
    atomic_write_text(path, "\n".join(report))
    print("\n".join(report))
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
