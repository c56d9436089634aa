"""What only a CUDA device can show (skipped without one; `make gpu-check` runs them):
no host sync inside an epoch's outer steps as CUDA itself counts them, and what repeats with
and without `--deterministic`. The CPU halves of these checks are tests/test_host_syncs.py
and tests/test_reliability.py (same config and seed, identical metrics).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from unbiased.methods import make_method

# cuBLAS reads it when it first starts: before any test of this session touches CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The paper preset's critic, at a size that runs in seconds.
VALUES = {"lam": 1.0, "batch_size": 128, "lr": 1e-3, "K": 16, "inner_z": "batch",
          "theta_update": "separate", "mine_ema_rate": 0.01, "mine_standardize": True,
          "mi_guard": True, "mine_lr": 1e-3}


def _bench(grey_digits, rows=1024):
    from unbiased.benchmarks.colored_mnist import GreyDigits, build

    d = grey_digits
    digits = GreyDigits(d.train_x[:rows], d.train_y[:rows], d.test_x[:256], d.test_y[:256],
                        "mnist5k")
    return build(digits, 0.03, seed=0, device="cuda")


def _weights(algo) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for m in algo.modules().values() for p in m.parameters()]


def test_cuda_counts_no_sync_in_an_outer_step(grey_digits):
    algo = make_method("mi_backprop", _bench(grey_digits), VALUES, seed=0, device="cuda")
    algo.run_epoch()  # warm-up: first-call allocations and lazy initialisation
    steps = -(-len(algo.bench.train) // algo.cfg.batch_size)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            algo.run_epoch()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # (torch also warns once that the debug mode is a prototype: not a sync.)
    syncs = [w for w in caught if "synchroniz" in str(w.message)
             and "prototype" not in str(w.message)]
    # None per step (mi_guard masks on the device); the epoch's mean loss, penalty and
    # guarded fraction at its end.
    assert steps >= 4 and len(syncs) <= 3, (len(syncs), steps, [str(w.message) for w in syncs])


def _two_epochs(grey_digits) -> list[torch.Tensor]:
    algo = make_method("mi_backprop", _bench(grey_digits), VALUES, seed=3, device="cuda")
    algo.run_epoch()
    algo.run_epoch()
    return _weights(algo)


def test_deterministic_repeats_on_cuda(grey_digits):
    from trainables.common import set_deterministic

    before = (torch.are_deterministic_algorithms_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        set_deterministic(torch.device("cuda"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first, second = _two_epochs(grey_digits), _two_epochs(grey_digits)
        no_kernel = [str(w.message) for w in caught if "deterministic" in str(w.message)]
        assert not no_kernel, no_kernel[0]
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    finally:
        torch.use_deterministic_algorithms(before[0])
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = before[1:]


def test_default_mode_on_cuda_is_recorded(grey_digits, record_property):
    # Not asserted either way: whether the default (cuDNN's own choice of kernels, TF32 where
    # torch allows it) repeats depends on the GPU and the kernels; gpu-check's report says.
    first, second = _two_epochs(grey_digits), _two_epochs(grey_digits)
    same = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    largest = max(float((a - b).abs().max()) for a, b in zip(first, second, strict=True))
    record_property("default_repeats", same)
    print(f"default mode repeats on this GPU: {same} (largest weight difference {largest:.3g})")
