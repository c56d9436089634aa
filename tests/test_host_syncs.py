"""No host sync inside an epoch's training steps: a GPU trial must not wait for the device at
any outer or inner step (on a GPU shared by four trials each sync also waits for the others'
work, and a CUDA graph of the outer step cannot hold one).

Counted on CPU, where every operation that would make the host wait for a GPU is still seen:
the scalar reads (`.item()`, `float()`, a tensor's `bool()`: aten._local_scalar_dense),
data-dependent shapes (nonzero, boolean-mask indexing, masked_select) and the copies out
(`.tolist()`, `.cpu()`, `.numpy()`).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import SMALL_NET_CONFIG
from unbiased.methods import make_method

SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default",
            "aten.masked_select.default", "aten.unique.default", "aten._unique2.default"}


class SyncCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        bool_index = name == "aten.index.Tensor" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or []))
        if name in SYNC_OPS or bool_index:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counter(monkeypatch):
    mode = SyncCounter()
    for method in ("tolist", "cpu", "numpy"):
        original = getattr(torch.Tensor, method)

        def counted(self, *a, _original=original, _name=method, **k):
            mode.syncs.append(f"Tensor.{_name}")
            return _original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, method, counted)
    return mode


def _bench(grey_digits):
    from unbiased.benchmarks.digits.data import GreyDigits, build

    d = grey_digits
    # The syncs an epoch makes do not depend on the net's size: the small one.
    return build(GreyDigits(d.train_x[:256], d.train_y[:256], d.test_x[:64], d.test_y[:64],
                            "mnist5k"), 0.03, seed=0, width=SMALL_NET_CONFIG["width"])


# The cpu preset's critic settings (moving-average gradient, standardised input, guard).
MI_BACKPROP = {"K": 8, "inner_z": "batch", "theta_update": "separate", "mine_ema_rate": 0.01,
               "mine_standardize": True, "mi_guard": True, "mine_lr": 1e-3}


# The syncs an epoch may make, all at its end: the mean task loss, the mean penalty and the
# guarded fraction are read once each. mi_guard decides on the device (a masked step).
AT_EPOCH_END = 3


@pytest.mark.parametrize(("method", "values"), [
    ("mi_backprop", MI_BACKPROP),
    ("mi_backprop", {**MI_BACKPROP, "theta_update": "joint"}),
    ("mi_backprop", {**MI_BACKPROP, "inner_z": "fresh", "mi_guard": False}),
    ("hsic", {}), ("lntl", {"lam": 0.01}), ("confusion", {}),
    # lam 0 with the default K 80 fresh forwards: slow
    pytest.param("erm", {"lam": 0.0}, marks=pytest.mark.slow)])
def test_no_host_sync_in_an_outer_step(method, values, grey_digits, counter):
    torch.set_num_threads(1)
    name = "mi_backprop" if method == "erm" else method
    algo = make_method(name, _bench(grey_digits), {"lam": 1.0, "batch_size": 32, "lr": 1e-3,
                                                   **values}, seed=0)
    steps = -(-len(algo.bench.train) // algo.cfg.batch_size)
    assert steps >= 8  # one sync per step would exceed the epoch's allowance
    with counter:
        algo.run_epoch()
    assert len(counter.syncs) <= AT_EPOCH_END, (len(counter.syncs), steps,
                                                sorted(set(counter.syncs)))


def test_the_counter_sees_a_sync_in_the_inner_loop(grey_digits, counter):
    # What the test above would catch: one read of the estimate per inner step.
    from unbiased.mine import MINE

    mine = MINE(4, 3, ema_rate=0.01)
    z, c = torch.randn(16, 4), torch.randn(16, 3)
    with counter:
        for _ in range(5):
            loss, estimate = mine.phi_loss(z, c)
            float(estimate)
            z[z > 0]
    assert counter.syncs.count("aten._local_scalar_dense.default") == 5
    assert counter.syncs.count("aten.index.Tensor") == 5
