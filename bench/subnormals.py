"""What subnormal weights cost a CPU training step, and what flushing them changes.

Late epochs of ERM-like trials on Biased MNIST ran up to 40x slower than their first (the
tune screen's epoch_s; docs/MEASURED.md, "Subnormal weights: late epochs on CPU"): units that
stop learning leave weights and Adam moments in float32's subnormal range (below 1.18e-38; 12%
of the first fully connected layer in a Group DRO checkpoint at epoch 6). This times one
step of Biased MNIST's LeNet (batch 128, one thread) with a share of subnormal weights, kept
and flushed (torch.set_flush_denormal, which every trial sets), against the same net without
them, and checks that flushing leaves the features and gradients bit for bit the same.

    python bench/subnormals.py [--share 0.12] [--steps 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from unbiased.models import LeNetFeatures  # noqa: E402


def step_ms(net: LeNetFeatures, x: torch.Tensor, steps: int) -> tuple[float, list[torch.Tensor]]:
    def step() -> list[torch.Tensor]:
        net.zero_grad()
        z = net(x)
        z.square().mean().backward()
        return [z.detach().clone(), *(p.grad.clone() for p in net.parameters())]

    step()
    start = time.perf_counter()
    for _ in range(steps):
        out = step()
    return (time.perf_counter() - start) / steps * 1000, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, default=0.12,
                        help="share of the weights set subnormal (default .12)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    clean, x = LeNetFeatures(), torch.rand(128, 3, 28, 28)
    sub = LeNetFeatures()
    sub.load_state_dict(clean.state_dict())
    with torch.no_grad():
        for p in sub.parameters():
            p[torch.rand_like(p) < args.share] = 1e-39
    times, outs = {}, {}
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        times[("clean", flush)], _ = step_ms(clean, x, args.steps)
        times[("subnormal", flush)], outs[flush] = step_ms(sub, x, args.steps)
    torch.set_flush_denormal(False)
    same = all(torch.equal(a, b) for a, b in zip(outs[False], outs[True], strict=True))
    for (net, flush), ms in times.items():
        kept = "flushed" if flush else "kept"
        print(f"{net:9s} weights, subnormals {kept:7s}: {ms:7.1f} ms a step")
    print(f"subnormals kept / flushed: "
          f"{times[('subnormal', False)] / times[('subnormal', True)]:.1f}x; "
          f"flushed / no subnormals: {times[('subnormal', True)] / times[('clean', True)]:.2f}x;"
          f" features and gradients the same flushed and kept: {same}")

if __name__ == "__main__":
    main()
