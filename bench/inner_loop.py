"""Cost of Algorithm 1's K inner MINE steps against a plain ERM step, measured in one run.

    python bench/inner_loop.py                                  # digits, K 20,80, batch 128, CPU
    python bench/inner_loop.py --batch-size 1024 --train-size 60000 --K 80
    python bench/inner_loop.py --K 80 --modes batch --theta-updates separate,joint
    python bench/inner_loop.py --device cuda --batch-size 1024 --train-size 60000 \
        --variants plain,amp,amp+channels_last,amp+compile

Modes: `fresh` (K new mini-batches through g without grad, Algorithm 1 as written), `batch`
(the current batch's z reused with new shuffles of c), `bank` (mini-batches from z of the whole
training set, recomputed every --bank-refresh outer steps) and `pool` (the same from a random
pool of --bank-size rows). Every setting keeps its own model; the settings are timed in turn,
--repeats times, so slow phases of a shared machine hit all of them, and each repeat's time is
divided by the ERM time of the same repeat. The table shows medians. Absolute times on a shared
machine are noise; the ratios are the signal.

--train-size N tiles the embedded 4,000 coloured digits to N rows (60000 = the size of full
MNIST), which is what a whole-set `bank` refresh costs; the images' content does not matter
for timing. Each timed block is --steps outer steps (a multiple of --bank-refresh, so a block
holds its fair share of bank refreshes).

--variants times every setting once per set of speed options (`plain`, or `+`-joined names
from amp, compile, channels_last); every ratio is to the ERM step of the first variant.

--fresh-forwards also times the K forwards of `fresh` alone, three ways, against an ERM step
of the same model: K forwards of a batch each under no_grad (what `fresh` does, one inner
batch drawn just before its MINE step), the same under inference_mode, and one batched
forward of all K x batch rows (drawn in advance) in chunks of 4096:

    python bench/inner_loop.py --modes fresh --K 80 --batch-size 1024 --fresh-forwards \
        --steps 1 --repeats 3 --variants channels_last
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from unbiased.benchmarks.digits import data as colored_mnist  # noqa: E402
from unbiased.data import Batch, Benchmark, TensorSplit  # noqa: E402
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig  # noqa: E402

MODES = ("fresh", "batch", "bank", "pool")
OPTIONS = ("amp", "compile", "channels_last")


class FirstSteps:
    """A training split whose epoch pass stops after `steps` batches; everything else (its
    size, c, the rows a bank or a fresh inner batch reads) is the whole split."""

    def __init__(self, split: TensorSplit, steps: int):
        self.split, self.steps = split, steps
        self.y, self.c = split.y, split.c

    def __len__(self) -> int:
        return len(self.split)

    def batches(self, batch_size: int, order: torch.Tensor | None = None) -> Iterator[Batch]:
        batches = self.split.batches(batch_size, order)
        if order is not None and len(order) == len(self.split):  # the epoch's own pass
            return itertools.islice(batches, self.steps)
        return batches

    def to(self, device: torch.device | str) -> FirstSteps:
        return FirstSteps(self.split.to(device), self.steps)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def tiled(bench: Benchmark, n: int) -> Benchmark:
    """The benchmark with its training split repeated (cut) to n rows."""
    tr = bench.train
    assert isinstance(tr, TensorSplit)
    idx = torch.arange(n, device=tr.y.device) % len(tr)
    return Benchmark(bench.name, TensorSplit(tr.x[idx], tr.y[idx], tr.c[idx]),
                     bench.eval_splits, bench.num_classes, bench.make_features, bench.z_dim,
                     bench.c_dim)


class Setting:
    """One row of the table: a model and how to time `steps` outer steps of it."""

    def __init__(self, name: str, algo: MIBackprop, erm: bool, steps: int):
        self.name, self.algo, self.erm, self.steps = name, algo, erm, steps
        self.train = FirstSteps(algo.bench.train, steps)  # type: ignore[arg-type]
        self.seconds: list[float] = []

    def run(self) -> float:
        """Seconds per outer step over one block of `steps` steps."""
        _sync(self.algo.device)
        start = time.perf_counter()
        if self.erm:
            for _ in range(self.steps):
                erm_step(self.algo)
        else:
            self.algo.run_epoch(self.train)  # type: ignore[arg-type]
        _sync(self.algo.device)
        return (time.perf_counter() - start) / self.steps


def erm_step(algo: MIBackprop) -> None:
    """A plain ERM step of the same g and f with the same optimiser and options."""
    train = algo.bench.train
    assert isinstance(train, TensorSplit)
    idx = torch.randint(len(train), (algo.cfg.batch_size,), generator=algo.gen,
                        device=algo.gen.device).to(algo.device)
    algo.g.train()
    loss = F.cross_entropy(algo.f(algo._features(train.x[idx])), train.y[idx])
    algo.model_opt.zero_grad(set_to_none=True)
    loss.backward()
    algo.model_opt.step()


FORWARDS = ("no_grad per batch", "inference_mode per batch", "one batched forward")


def fresh_forwards(algo: MIBackprop, K: int, how: str) -> float:
    """Seconds for the K inner forwards of one outer step of `fresh`, done `how`."""
    train = algo.bench.train
    assert isinstance(train, TensorSplit)
    bs = algo.cfg.batch_size
    algo.g.train()  # as in the inner loop: g stays in training mode
    rows = torch.randint(len(train), (K * bs,), generator=algo.gen,
                         device=algo.gen.device).to(algo.device)
    _sync(algo.device)
    start = time.perf_counter()
    if how == FORWARDS[2]:
        with torch.no_grad():
            for i in range(0, K * bs, 4096):
                algo._features(train.x[rows[i:i + 4096]])
    else:
        ctx = torch.no_grad if how == FORWARDS[0] else torch.inference_mode
        for k in range(K):
            with ctx():
                algo._features(train.x[rows[k * bs:(k + 1) * bs]])
    _sync(algo.device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--K", default="20,80", help="comma-separated K values")
    p.add_argument("--modes", default=",".join(MODES), help=f"inner z modes, from {MODES}")
    p.add_argument("--bank-refresh", type=int, default=10,
                   help="outer steps between bank recomputations (bank, pool)")
    p.add_argument("--bank-size", type=int, default=4096, help="rows in the pool (pool)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--train-size", type=int, default=0,
                   help="tile the training set to this many rows (0: the embedded 4,000)")
    p.add_argument("--steps", type=int, default=10, help="outer steps per timed block")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per setting")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--theta-updates", default="separate",
                   help="comma-separated theta updates to time (separate, joint): separate "
                        "takes two backward passes of g per step (task and MI gradients)")
    p.add_argument("--width", type=int, default=64,
                   help="LeNet conv channels (64 the paper's, 32 the cpu preset's)")
    p.add_argument("--mine-ema-rate", type=float, default=None,
                   help="MINE's moving-average gradient rate (default: plain DV gradient)")
    p.add_argument("--variants", default="plain",
                   help=f"comma-separated option sets: plain or +-joined names of {OPTIONS}")
    p.add_argument("--fresh-forwards", action="store_true",
                   help="also time fresh's K forwards alone: per batch (no_grad, "
                        "inference_mode) and batched, against an ERM step")
    args = p.parse_args(argv)
    variants = {v: [] if v == "plain" else v.split("+") for v in args.variants.split(",")}
    if any(o not in OPTIONS for opts in variants.values() for o in opts):
        raise SystemExit(f"error: --variants names must come from plain, {OPTIONS}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but CUDA is not available")
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        raise SystemExit(f"error: --modes must come from {MODES}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    bench = colored_mnist.build(colored_mnist.load_mnist5k(), 0.02, seed=0,
                                width=args.width).to(device)
    if args.train_size:
        bench = tiled(bench, args.train_size)
    n_train = len(bench.train)

    updates = args.theta_updates.split(",")

    def make(name: str, K: int, mode: str, options: list[str], erm: bool = False,
             update: str = "separate") -> Setting:
        cfg = MIBackpropConfig(lam=1.0, K=K, batch_size=args.batch_size, lr=1e-4, mine_lr=1e-4,
                               inner_z="bank" if mode == "pool" else mode, theta_update=update,
                               mine_ema_rate=args.mine_ema_rate,
                               bank_refresh=args.bank_refresh,
                               bank_size=args.bank_size if mode == "pool" else None,
                               **{o: True for o in options})
        return Setting(name, MIBackprop(bench, cfg, seed=0, device=device), erm, args.steps)

    settings = []
    for variant, options in variants.items():
        tag = "" if variant == "plain" else f" [{variant}]"
        settings.append(make("ERM" + tag, 1, "batch", options, erm=True))
        for K, mode, update in itertools.product([int(k) for k in args.K.split(",")], modes,
                                                 updates):
            label = f"K={K} {mode}"
            if mode in ("bank", "pool"):
                label += f" R={args.bank_refresh}"
            if mode == "pool":
                label += f" N={args.bank_size}"
            if len(updates) > 1 or update != "separate":
                label += f" {update}"
            settings.append(make(label + tag, K, mode, options, update=update))
    base_erm = settings[0].name
    warmup = {}
    for s in settings:  # warm-up block (first-call allocations, compilation)
        start = time.perf_counter()
        s.run()
        warmup[s.name] = time.perf_counter() - start
    ratios: dict[str, list[float]] = {s.name: [] for s in settings}
    for _ in range(args.repeats):
        times = {s.name: s.run() for s in settings}
        for s in settings:
            s.seconds.append(times[s.name])
            ratios[s.name].append(times[s.name] / times[base_erm])

    steps_60k = -(-60_000 // args.batch_size)
    print(f"device {device}, threads {args.threads}, batch {args.batch_size}, width "
          f"{args.width}, MINE ema {args.mine_ema_rate}, train rows "
          f"{n_train}, {args.repeats} repeats x {args.steps} steps, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| setting | ms/step | x ERM | x ERM range | s/epoch 60k | warm-up block s |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in settings:
        ms = statistics.median(s.seconds) * 1e3
        r = ratios[s.name]
        print(f"| {s.name} | {ms:.1f} | {statistics.median(r):.2f} | "
              f"{min(r):.2f}-{max(r):.2f} | {ms * steps_60k / 1e3:.1f} | "
              f"{warmup[s.name]:.1f} |", flush=True)
    if args.fresh_forwards:
        erm = settings[0]
        for K in [int(k) for k in args.K.split(",")]:
            for how in FORWARDS:
                fresh_forwards(erm.algo, K, how)  # warm-up
            seconds: dict[str, list[float]] = {how: [] for how in FORWARDS}
            for _ in range(args.repeats):
                erm_s = erm.run()
                for how in FORWARDS:
                    seconds[how].append(fresh_forwards(erm.algo, K, how) / erm_s)
            print(f"\nfresh's K = {K} inner forwards of batch {args.batch_size} per outer "
                  f"step, x ERM step ({erm.name}), medians of {args.repeats}:")
            for how in FORWARDS:
                print(f"  {how:<26}{statistics.median(seconds[how]):>7.2f}")


if __name__ == "__main__":
    main()
