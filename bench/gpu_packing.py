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

    seconds per trial = 150 * (59 * s_step + s_eval) + (150 // mi_eval_every * 4 + 2) * s_critic,
    trials per GPU-hour = 3600 * n / seconds per trial,

measured under packing n, with the preset's own method settings (trial_values) and its
stopping rule's fresh critics (s_critic: one mi_eval of mi_eval_steps steps).

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

from unbiased.benchmarks.digits.spec import DIGITS  # noqa: E402

EPOCHS_PAPER = 150
TRAIN_ROWS = 60_000


def worker(rank: int, opts: dict, barrier, results) -> None:
    from inner_loop import FirstSteps, tiled

    from unbiased.benchmarks.digits import data as colored_mnist
    from unbiased.methods import make_method
    from unbiased.mine import mi_eval

    torch.set_num_threads(1)
    device = torch.device("cuda")
    bench = tiled(colored_mnist.build(colored_mnist.load_mnist5k(), 0.03, seed=rank,
                                      device=device), TRAIN_ROWS)
    algo = make_method("mi_backprop", bench, trial_values(opts), seed=rank, device=device)
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
    z, _, c = algo.train_eval_set()
    start = time.perf_counter()
    mi_eval(z, c, seed=rank, steps=opts["mi_eval_steps"])  # one fresh critic of the stopping rule
    torch.cuda.synchronize()
    s_critic = time.perf_counter() - start
    results.put((rank, s_step, s_eval, s_critic, torch.cuda.max_memory_allocated() / 2**30))


def trial_values(opts: dict) -> dict:
    """A lam = 1 trial's method settings: the paper preset's, with this script's overrides
    (tests/test_gpu_packing.py checks that nothing else differs)."""
    paper = DIGITS["paper"]
    keys = ("K", "batch_size", "inner_z", "bank_refresh", "bank_size", "amp", "compile",
            "channels_last")
    return {**{k: v for k, v in paper.items() if k not in ("lam", "K")}, "lam": 1.0,
            **{k: opts[k] for k in keys if opts.get(k) is not None}}


def trial_seconds(s_step: float, s_eval: float, s_critic: float, batch_size: int) -> float:
    """A paper trial: every epoch's outer steps and evaluation, and the stopping rule's fresh
    critics (4 every mi_eval_every epochs, the chosen epoch's 2 again at the end)."""
    paper = DIGITS["paper"]
    steps_epoch = -(-TRAIN_ROWS // batch_size)
    critics = EPOCHS_PAPER // int(paper["mi_eval_every"]) * 4 + 2
    return EPOCHS_PAPER * (steps_epoch * s_step + s_eval) + critics * s_critic


def measure(n: int, opts: dict) -> tuple[float, float, float, float]:
    """(median s/outer step, s/evaluation, s/fresh critic, max GiB) of n trials sharing the
    GPU."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, opts, barrier, results)) for r in range(n)]
    for proc in procs:
        proc.start()
    rows = [results.get() for _ in range(n)]
    for proc in procs:
        proc.join()
    return (statistics.median(r[1] for r in rows), statistics.median(r[2] for r in rows),
            statistics.median(r[3] for r in rows), max(r[4] for r in rows))


def parse(argv: list[str] | None = None) -> tuple[str, dict]:
    """(the packings, the options of every trial); every default is the paper preset's."""
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
    for flag in ("amp", "compile", "channels_last"):
        p.add_argument("--" + flag.replace("_", "-"), action=argparse.BooleanOptionalAction,
                       default=bool(paper.get(flag, False)))
    args = p.parse_args(argv)
    opts = {"K": args.K, "batch_size": args.batch_size, "inner_z": args.inner_z,
            "bank_refresh": args.bank_refresh, "bank_size": args.bank_size, "amp": args.amp,
            "compile": args.compile, "channels_last": args.channels_last,
            "steps": args.steps, "warmup": args.warmup,
            "mi_eval_steps": int(paper["mi_eval_steps"])}
    return args.packing, opts


def main(argv: list[str] | None = None) -> int:
    packing, opts = parse(argv)
    if not torch.cuda.is_available():
        print("error: bench/gpu_packing.py needs a CUDA GPU (none visible here); "
              "see bench/RESULTS.md for what is pending", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}, {opts}")
    print("| trials/GPU | s/outer step | s/eval | s/fresh critic | GiB/trial | h/trial | "
          "trials/GPU-hour |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(t) for t in packing.split(",")]:
        s_step, s_eval, s_critic, gib = measure(n, opts)
        trial_s = trial_seconds(s_step, s_eval, s_critic, opts["batch_size"])
        print(f"| {n} | {s_step:.4f} | {s_eval:.2f} | {s_critic:.2f} | {gib:.2f} | "
              f"{trial_s / 3600:.2f} | {3600 * n / trial_s:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
