"""Ray Tune function trainable for Colored MNIST.

Use through `tune.with_parameters(train_digits, digits=grey_digits)` so the grey digits are put
in the object store once per sweep instead of being re-read by every trial; without it each
trial reads its own copy (`source`, `root`; full MNIST is not downloaded by a trial).
"""

from __future__ import annotations

from trainables.common import pick_device, run_trial
from unbiased.benchmarks import colored_mnist
from unbiased.benchmarks.colored_mnist import GreyDigits


def build_digits(config: dict, digits: GreyDigits | None = None) -> colored_mnist.Benchmark:
    if digits is None:
        digits = colored_mnist.load_grey_digits(config.get("source", "mnist5k"),
                                                config.get("root"))
    # Coloured on the training device: run_trial's .to(device) is then a no-op.
    return colored_mnist.build(digits, float(config["sigma"]), int(config["seed"]),
                               z_dim=int(config.get("z_dim", 64)),
                               z_relu=bool(config.get("z_relu", False)),
                               width=int(config.get("width", 64)),
                               palette=str(config.get("palette", "separated")),
                               stroke=str(config.get("stroke", "scaled")),
                               device=pick_device(str(config.get("device", "auto"))))


def train_digits(config: dict, digits: GreyDigits | None = None) -> None:
    """Config keys: method and its config fields (unbiased/methods), seed, epochs, device,
    num_threads, mi_eval_steps, select_epoch (trainables/common.py); sigma, source, root,
    z_dim, z_relu, width, palette, stroke (the build); fail_once_at_epoch (tests only)."""
    run_trial(config, lambda cfg: build_digits(cfg, digits))
