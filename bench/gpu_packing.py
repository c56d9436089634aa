"""Trials per GPU-hour of the paper's digits preset with 1, 2, 4 and 8 trials sharing one GPU.

    python bench/gpu_packing.py                          # paper preset, its default inner z
    python bench/gpu_packing.py --packing 1,2,4,8 --inner-z fresh --steps 20 --amp

Needs a CUDA GPU; on a machine without one it stops with one line. For each packing n it starts
n processes (what Tune's fractional GPUs, e.g. --gpus-per-trial 0.25, do: one process per trial
on the same device), each with the paper preset's model on 60,000 coloured digits (the embedded
4,000 tiled: the content does not matter for timing) already on the GPU. They warm up, wait for
each other, and time --steps outer steps together, plus one full evaluation pass (train 60k +
test 10k, what a trial does every epoch). A trial of the paper preset is 150 epochs of
ceil(60000 / 1024) = 59 outer steps and one evaluation each, so

    seconds per trial = 150 * (59 * s_step + s_eval), measured under packing n,
    trials per GPU-hour = 3600 * n / seconds per trial.

Not measured here: stacking several lambdas into one batched model with torch.func
(stack_module_state + vmap), the next step if the GPU is still mostly idle at 8 per GPU.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from sweeps.presets import DIGITS  # noqa: E402

EPOCHS_PAPER = 150
TRAIN_ROWS = 60_000


def worker(rank: int, opts: dict, barrier, results) -> None:
    from inner_loop import FirstSteps, tiled

    from unbiased.benchmarks import colored_mnist
    from unbiased.train import Algorithm1, LoopConfig

    torch.set_num_threads(1)
    device = torch.device("cuda")
    bench = tiled(colored_mnist.build(colored_mnist.load_mnist5k(), 0.03, seed=rank,
                                      device=device), TRAIN_ROWS)
    cfg = LoopConfig(lam=1.0, K=opts["K"], batch_size=opts["batch_size"], lr=1e-4,
                     mine_lr=1e-4, inner_z=opts["inner_z"], bank_refresh=opts["bank_refresh"],
                     bank_size=opts["bank_size"], amp=opts["amp"], compile=opts["compile"],
                     channels_last=opts["channels_last"])
    algo = Algorithm1(bench, cfg, seed=rank, device=device)
    algo.run_epoch(FirstSteps(bench.train, opts["warmup"]))  # type: ignore[arg-type]
    algo.evaluate()
    torch.cuda.synchronize()
    barrier.wait()
    start = time.perf_counter()
    algo.run_epoch(FirstSteps(bench.train, opts["steps"]))  # type: ignore[arg-type]
    torch.cuda.synchronize()
    s_step = (time.perf_counter() - start) / opts["steps"]
    start = time.perf_counter()
    algo.evaluate()
    torch.cuda.synchronize()
    s_eval = time.perf_counter() - start
    results.put((rank, s_step, s_eval, torch.cuda.max_memory_allocated() / 2**30))


def measure(n: int, opts: dict) -> tuple[float, float, float]:
    """(median s/outer step, median s/evaluation, max GiB) of n trials sharing the GPU."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, opts, barrier, results)) for r in range(n)]
    for proc in procs:
        proc.start()
    rows = [results.get() for _ in range(n)]
    for proc in procs:
        proc.join()
    return (statistics.median(r[1] for r in rows), statistics.median(r[2] for r in rows),
            max(r[3] for r in rows))


def main(argv: list[str] | None = None) -> int:
    paper = DIGITS["paper"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--packing", default="1,2,4,8", help="trials per GPU, comma-separated")
    p.add_argument("--inner-z", default=str(paper["inner_z"]),
                   choices=["fresh", "batch", "bank"])
    p.add_argument("--bank-refresh", type=int, default=int(paper.get("bank_refresh", 10)))
    p.add_argument("--bank-size", type=int, default=paper.get("bank_size"))
    p.add_argument("--K", type=int, default=int(paper["K"]))  # type: ignore[arg-type]
    p.add_argument("--batch-size", type=int, default=int(paper["batch_size"]))
    p.add_argument("--steps", type=int, default=20, help="timed outer steps per trial")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench/gpu_packing.py needs a CUDA GPU (none visible here); "
              "see bench/RESULTS.md for what is pending", file=sys.stderr)
        return 2
    opts = {"K": args.K, "batch_size": args.batch_size, "inner_z": args.inner_z,
            "bank_refresh": args.bank_refresh, "bank_size": args.bank_size, "amp": args.amp,
            "compile": args.compile, "channels_last": args.channels_last,
            "steps": args.steps, "warmup": args.warmup}
    steps_epoch = -(-TRAIN_ROWS // args.batch_size)
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}, {opts}")
    print("| trials/GPU | s/outer step | s/eval | GiB/trial | h/trial | trials/GPU-hour |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in [int(t) for t in args.packing.split(",")]:
        s_step, s_eval, gib = measure(n, opts)
        trial_s = EPOCHS_PAPER * (steps_epoch * s_step + s_eval)
        print(f"| {n} | {s_step:.4f} | {s_eval:.2f} | {gib:.2f} | {trial_s / 3600:.2f} | "
              f"{3600 * n / trial_s:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
