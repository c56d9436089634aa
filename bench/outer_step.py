"""Milliseconds per outer step of the `paper` preset's training step: one trial alone, and
trial bundles of B members, with the kernels (or, on a CPU, operator calls) each takes and the
memory it holds; and the `paper` grid's training time projected from them.

    python bench/outer_step.py --device cuda                  # one GPU, ~3-5 minutes
    python bench/outer_step.py --device cpu --B 1,3 --K 4 --batch-size 64 --steps 2  # a check

The step is the paper preset's (batch 1024, K 80, separate theta update, MINE moving-average
gradient .01, standardised critic, guard, LeNet width 64) on the embedded 4,000 coloured
digits (sigma .03): the data do not change a step's cost. "alone" is one trial's step
(what a `--gpus-per-trial` trial runs); "bundle B" is `--bundle B`'s step of B members (lam
spread over 0..1, seeds 0..B-1), the critic's shuffles drawn at once on a GPU ("batched").
Each comes eager and, on CUDA, "graphed" (`--cuda-graphs`: captured once, then replayed;
kernels inside a replayed graph are counted as the profiler sees them). A bundle that does
not fit in memory is reported so. The projection: the grid's 63 trials x 150
epochs x 59 steps, B at a time (B = 1: 4 trials at 0.25 GPU each, the preset's packing,
counted as no faster than one after another), training steps only: evaluation and the
stopping rule's critics come on top (gpu_check.py measures them). TF32 is reported as found;
`--tf32` turns it on for matmuls and convolutions.
Writes REPORT/outer_step_<device>.md (default bench/results/gpu/).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from unbiased.benchmarks.digits.data import build, load_mnist5k  # noqa: E402
from unbiased.graphs import WARMUP_CALLS  # noqa: E402
from unbiased.methods.bundle import MIBackpropBundle  # noqa: E402
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig  # noqa: E402

GRID_TRIALS, EPOCHS, STEPS_PER_EPOCH = 63, 150, 59  # the paper grid at batch 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--B", default="1,3,7,21,63", help="bundle sizes, comma-separated")
    p.add_argument("--K", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="timed outer steps per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions")
    p.add_argument("--no-graphs", action="store_true",
                   help="eager rows only (on CUDA the graphed rows come too by default)")
    p.add_argument("--report", type=Path, default=ROOT / "bench" / "results" / "gpu")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (try --device cpu)")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step, device: torch.device, steps: int, repeats: int) -> float:
    """Median over repeats of the seconds per call of `step`."""
    # Warm-up: lazy state, allocator pools, cuDNN's choice; a graphed step's eager calls
    # and its capture.
    for _ in range(WARMUP_CALLS + 2):
        step()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def _calls(step, device: torch.device) -> int:
    """Kernels one call launches on a GPU (operator calls on a CPU), by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::"))


def measure(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    bench = build(load_mnist5k(), 0.03, seed=0, device=device)
    cfg = dict(batch_size=args.batch_size, K=args.K, lr=1e-4, mine_lr=1e-4, inner_z="batch",
               theta_update="separate", mine_ema_rate=0.01, mine_standardize=True,
               mi_guard=True)
    train = bench.train
    rows = torch.arange(args.batch_size, device=device) % len(train)
    x, y, c = train.x[rows], train.y[rows], train.c[rows]
    results = []
    modes = [False] + ([True] if device.type == "cuda" and not args.no_graphs else [])
    for graphs in modes:
        kind = "graphed" if graphs else "eager"
        alone = MIBackprop(bench, MIBackpropConfig(**cfg, lam=1.0, cuda_graphs=graphs), seed=0,
                           device=device)

        def alone_step(alone=alone):
            alone.update(x, y, c, rows, train)
        results.append(_row(f"{kind} alone", 1, alone_step, device, args,
                            graphed=lambda alone=alone: alone.graphed()))
        alone = alone_step = None
        for size in [int(b) for b in args.B.split(",")]:
            results.append(_bundle_row(kind, size, bench, cfg, graphs, (x, y, c), device,
                                       args))
    return results


def _bundle_row(kind: str, size: int, bench, cfg: dict, graphs: bool, batch: tuple,
                device: torch.device, args: argparse.Namespace) -> dict:
    x, y, c = batch
    try:
        members = [MIBackprop(bench, MIBackpropConfig(**cfg, lam=i / max(1, size - 1),
                                                      cuda_graphs=graphs), seed=i, device=device)
                   for i in range(size)]
        bundle = MIBackpropBundle(members,
                                  draws="batched" if device.type == "cuda" else "exact")
        xs = torch.stack([x] * size, dim=1)
        ys, cs = torch.stack([y] * size), torch.stack([c] * size)

        def bundle_step(bundle=bundle, xs=xs, ys=ys, cs=cs):
            if bundle.step_graph is not None:
                bundle.step_graph(xs, ys, cs)
            else:
                bundle.update(xs, ys, cs, 1.0)
        return _row(f"{kind} bundle {size}", size, bundle_step, device, args,
                    graphed=lambda: bundle.graphed())
    except torch.OutOfMemoryError as exc:
        return {"what": f"{kind} bundle {size}", "members": size,
                "note": f"out of memory: {str(exc).splitlines()[0][:120]}"}
    finally:
        members = bundle = xs = ys = cs = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _row(what: str, members: int, step, device: torch.device,
         args: argparse.Namespace, graphed=None) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(step, device, args.steps, args.repeats)
    if callable(graphed):
        graphed = graphed()
    if graphed is False:  # asked for, and the capture failed: the row is eager
        what += " (capture failed: ran eager)"
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    try:
        calls = _calls(step, device)
    except Exception as exc:  # noqa: BLE001 - the profiler's failure is reported, not fatal
        print(f"{what}: the profiler failed ({type(exc).__name__}: {exc}); kernels not "
              f"counted", flush=True)
        calls = -1
    per_member = seconds / members
    grid_h = GRID_TRIALS * EPOCHS * STEPS_PER_EPOCH * per_member / 3600
    return {"what": what, "members": members, "ms": seconds * 1e3,
            "ms_per_member": per_member * 1e3, "calls": calls, "peak_gib": peak,
            "grid_h": grid_h, "trial_min": EPOCHS * STEPS_PER_EPOCH * seconds / 60}


def report(args: argparse.Namespace, results: list[dict]) -> str:
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    unit = "kernels" if device.type == "cuda" else "operator calls"
    lines = [f"# Outer step of the paper preset: {name}", "",
             f"`python bench/outer_step.py {' '.join(sys.argv[1:])}`; torch {torch.__version__}, "
             f"TF32 matmul {tf32[0]}, cuDNN TF32 {tf32[1]}; batch {args.batch_size}, K {args.K}, "
             f"separate, ema .01, standardised critic, guard, LeNet width 64; median of "
             f"{args.repeats} x {args.steps} steps.", "",
             f"| step | members | ms per outer step | ms per member | {unit} per step | "
             f"peak GiB | one trial's training (min) | the 63-trial grid's training (h) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "note" in r:
            lines.append(f"| {r['what']} | {r['members']} | {r['note']} | | | | | |")
            continue
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        lines.append(f"| {r['what']} | {r['members']} | {r['ms']:.1f} | "
                     f"{r['ms_per_member']:.1f} | {r['calls']} | {peak} | "
                     f"{r['trial_min']:.1f} | {r['grid_h']:.2f} |")
    lines += ["", "A trial's training: 150 epochs x 59 steps at this step's time (a bundle "
              "trains its members in that time). The grid: 63 trials, B at a time, one after "
              "another on one device; evaluation and the stopping rule's critics come on "
              "top."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = report(args, measure(args))
    print(text)
    device = torch.device(args.device)
    name = (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    print(f"wrote {write_report(args.report, 'outer_step', name, text)}")
    return 0


def write_report(folder: Path, stem: str, device_name: str, text: str) -> Path:
    """FOLDER/<stem>_<device, as a slug>.md, written atomically."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in device_name.lower()).strip("-")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}_{slug}.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
