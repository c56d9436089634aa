"""Seconds per step of the IMDB model (ResNet-50 + FC 128): plain ERM vs Algorithm 1 with K
inner MINE steps, in one process.

    python bench/imdb_step.py                               # CPU, 1 thread, batch 24, 224 px
    python bench/imdb_step.py --threads 2 --modes fresh,batch
    python bench/imdb_step.py --device cuda --steps 20

Inputs are random tensors already preprocessed (the model's cost alone); `decode` times the
JPEG side separately: decoding and preprocessing one batch of generated 250x250 JPEGs (about
the size of an imdb_crop face) through the benchmark's Dataset in this process. Absolute
times on shared machines are noise; the ratios are the signal.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from unbiased.benchmarks.imdb import data as imdb_faces  # noqa: E402
from unbiased.data import Benchmark, TensorSplit  # noqa: E402
from unbiased.methods.mi_backprop import MIBackprop, MIBackpropConfig  # noqa: E402
from unbiased.models import ResNetFeatures  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def random_split(n: int, size: int, seed: int = 0) -> TensorSplit:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=gen)
    y = torch.randint(2, (n,), generator=gen)
    age = torch.randint(0, 90, (n,), generator=gen).numpy()
    return TensorSplit(x, y, imdb_faces.age_bins(age))


def time_erm(algo: MIBackprop, split: TensorSplit, batch_size: int, steps: int) -> float:
    """Seconds per plain ERM step (forward, backward, Adam) of the same g and f."""
    opt = torch.optim.Adam([*algo.g.parameters(), *algo.f.parameters()], lr=1e-5)
    algo.g.train()

    def step(i: int) -> None:
        x = split.x[i * batch_size:(i + 1) * batch_size]
        y = split.y[i * batch_size:(i + 1) * batch_size]
        loss = F.cross_entropy(algo.f(algo.g(x)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step(0)  # warm-up
    _sync(algo.device)
    start = time.perf_counter()
    for i in range(1, steps + 1):
        step(i)
    _sync(algo.device)
    return (time.perf_counter() - start) / steps


def time_outer(algo: MIBackprop, split: TensorSplit, batch_size: int, steps: int) -> float:
    """Seconds per outer step of Algorithm 1 through the real epoch code (one warm-up step)."""
    def rows(a: int, b: int) -> TensorSplit:
        return TensorSplit(split.x[a:b], split.y[a:b], split.c[a:b])

    algo.run_epoch(rows(0, batch_size))
    _sync(algo.device)
    start = time.perf_counter()
    algo.run_epoch(rows(batch_size, batch_size * (steps + 1)))
    _sync(algo.device)
    return (time.perf_counter() - start) / steps


def time_decode(batch_size: int, image_size: int) -> float:
    """Seconds to decode and preprocess one batch of JPEGs in this process."""
    from PIL import Image

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(batch_size):
            name = f"{i}.jpg"
            pixels = rng.integers(0, 256, (250, 250, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(Path(tmp) / name, quality=90)
            paths.append(name)
        data = imdb_faces.FaceImages(tmp, paths, image_size)
        data[0]
        start = time.perf_counter()
        torch.stack([data[i] for i in range(len(data))])
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="resnet50", choices=["resnet50", "resnet18"])
    p.add_argument("--K", type=int, default=20)
    p.add_argument("--modes", default="fresh,batch", help="inner z modes to time")
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=2, help="timed steps per setting")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    bs = args.batch_size
    split = random_split(bs * (args.steps + 1), args.image_size).to(device)
    bench = Benchmark("imdb", split, {}, imdb_faces.NUM_CLASSES,
                      lambda: ResNetFeatures(args.arch, imdb_faces.Z_DIM, None), imdb_faces.Z_DIM,
                      imdb_faces.C_DIM)

    def make(K: int, mode: str) -> MIBackprop:
        cfg = MIBackpropConfig(lam=0.9, K=K, batch_size=bs, lr=1e-5, mine_lr=0.1,
                               mine_optimizer="sgd", inner_z=mode)
        return MIBackprop(bench, cfg, seed=0, device=device)

    print(f"{args.arch}, device {device}, threads {args.threads}, batch {bs}, "
          f"{args.image_size}x{args.image_size}, {args.steps} timed steps, "
          f"{time.strftime('%Y-%m-%d')}")
    erm = time_erm(make(1, "batch"), split, bs, args.steps)
    # 2,000 images at batch 24: 84 steps per epoch, 6 epochs (the paper's IMDB training).
    steps_run = 6 * -(-2000 // bs)
    print(f"{'setting':<16}{'s/step':>9}{'x ERM':>8}{'min/2k x 6 ep':>15}")
    print(f"{'ERM':<16}{erm:>9.2f}{1.0:>8.2f}{erm * steps_run / 60:>15.1f}", flush=True)
    for mode in args.modes.split(","):
        sec = time_outer(make(args.K, mode), split, bs, args.steps)
        print(f"{f'K={args.K} {mode}':<16}{sec:>9.2f}{sec / erm:>8.2f}"
              f"{sec * steps_run / 60:>15.1f}", flush=True)
    decode = time_decode(bs, args.image_size)
    print(f"{'decode (1 proc)':<16}{decode:>9.2f}{decode / erm:>8.2f}"
          f"{'(per batch of JPEGs)':>22}")


if __name__ == "__main__":
    main()
