"""One inner MINE step (T forward on joint and shuffled pairs, backward, optimiser step) four
ways: two separate T passes with plain Adam, with fused Adam, as MINE.phi_loss does it
(fused Adam + one stacked T pass), and that with T on batch-standardised z
(`--mine-standardize`). Results: bench/RESULTS.md, "MINE step itself".

    python bench/mine_step.py                   # digits T (z 64, c 24), batch 256 and 1024

The variants are timed in turn, --repeats blocks of --steps steps, medians in ms per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from unbiased.mine import MINE, dv_bound, shuffled  # noqa: E402


def make_step(batch: int, fused: bool, stacked: bool, standardize: bool = False
              ) -> Callable[[], None]:
    torch.manual_seed(0)
    mine = MINE(64, 24, standardize=standardize)
    opt = torch.optim.Adam(mine.parameters(), lr=1e-4, fused=fused)
    z = torch.randn(batch, 64)
    c = torch.nn.functional.one_hot(torch.randint(24, (batch,)), 24).float()
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        if stacked:  # what MINE.phi_loss does
            loss, _ = mine.phi_loss(z, c, gen)
        else:  # two separate passes of T
            loss = -dv_bound(mine.T(z, c), mine.T(z, shuffled(c, gen)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", default="256,1024")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, {args.repeats} repeats x {args.steps} steps, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| batch | Adam, 2 T passes (before) | fused Adam, 2 passes | fused Adam, 1 stacked "
          "pass (now) | now, standardised z | standardised / now |\n|---:|---:|---:|---:|---:|"
          "---:|")
    for batch in [int(b) for b in args.batch_size.split(",")]:
        variants = [make_step(batch, False, False), make_step(batch, True, False),
                    make_step(batch, True, True), make_step(batch, True, True, True)]
        for step in variants:
            for _ in range(3):
                step()
        times: list[list[float]] = [[] for _ in variants]
        for _ in range(args.repeats):
            for i, step in enumerate(variants):
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                times[i].append((time.perf_counter() - start) / args.steps * 1e3)
        medians = [statistics.median(t) for t in times]
        print(f"| {batch} | " + " | ".join(f"{m:.2f}" for m in medians)
              + f" | {medians[3] / medians[2]:.2f} |")


if __name__ == "__main__":
    main()
