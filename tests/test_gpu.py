"""What only a CUDA device can show (skipped without one; `make gpu-check` runs them):
no host sync inside an epoch's outer steps as CUDA itself counts them, and what repeats with
and without `--deterministic`. The CPU halves of these checks are tests/test_host_syncs.py
and tests/test_reliability.py (same config and seed, identical metrics).
"""

from __future__ import annotations

import math
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
    from unbiased.benchmarks.digits.data import GreyDigits, build

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
    from unbiased.trial import set_deterministic

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


# --cuda-graphs: the paper preset's step (batch 128 here), graphed against eager. In the
# default mode two eager runs differ already (test_default_mode_on_cuda_is_recorded), and
# Adam turns rounding noise on gradients that are truly 0 into steps of up to lr (docs/
# MEASURED.md, "trial bundles"): the comparisons run in deterministic mode.
GRAPH_VALUES = {**VALUES, "lr": 1e-4, "mine_lr": 1e-4}


@pytest.fixture
def deterministic():
    from unbiased.trial import set_deterministic

    before = (torch.are_deterministic_algorithms_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    set_deterministic(torch.device("cuda"))
    yield
    torch.use_deterministic_algorithms(before[0])
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
     torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = before[1:]


def _weights_differ(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_graphed_outer_steps_match_eager_ones(grey_digits, record_property, deterministic,
                                              amp):
    """From the same state, 5 replayed outer steps (after 3 eager ones and the capture) move
    every weight, moment and MINE average as 5 eager steps do, within float tolerance; under
    bf16 autocast too (`--amp`: its weight cache off, each replay casts the weights anew)."""
    from unbiased.graphs import WARMUP_CALLS

    bench = _bench(grey_digits)
    runs = {}
    for graphs in (False, True):
        algo = make_method("mi_backprop", bench, {**GRAPH_VALUES, "cuda_graphs": graphs,
                                                  "amp": amp},
                           seed=0, device="cuda")
        train = algo.bench.train
        for step in range(WARMUP_CALLS + 5):
            rows = torch.arange(step * 128, (step + 1) * 128, device="cuda")
            x, y, c = train.x[rows], train.y[rows], train.c[rows]
            algo.update(x, y, c, rows, train)
        torch.cuda.synchronize()
        if graphs:
            assert algo.step_graph is not None and algo.step_graph.failure is None, \
                algo.step_graph.failure
            assert algo.step_graph.replays == 5  # the captured step is replayed once too
            assert algo.graphed() is True
        runs[graphs] = (_weights(algo), float(algo.mine.log_ema), algo.theta_steps,
                        [s["exp_avg"].cpu() for s in algo.model_opt.state.values()])
    eager, graphed = runs[False], runs[True]
    largest = _weights_differ(eager[0], graphed[0])
    record_property(f"graphed_vs_eager_weights{'_bf16' if amp else ''}", largest)
    print(f"graphed vs eager after {WARMUP_CALLS + 5} steps{' (bf16)' if amp else ''}: "
          f"largest weight difference {largest:.3g}")
    assert largest < 1e-4
    assert abs(eager[1] - graphed[1]) < 1e-3
    assert eager[2] == graphed[2] == WARMUP_CALLS + 5
    assert _weights_differ(eager[3], graphed[3]) < 1e-4


def test_graphed_epochs_with_a_short_last_batch_match_eager_ones(grey_digits, deterministic):
    """Whole epochs graphed: the full batches and the shorter last one each get a graph (the
    last after its own 3 eager calls, one an epoch), and the epochs' metrics follow eager."""
    bench = _bench(grey_digits, rows=1000)  # 7 batches of 128, then 104 rows
    stats = {}
    for graphs in (False, True):
        algo = make_method("mi_backprop", bench, {**GRAPH_VALUES, "cuda_graphs": graphs},
                           seed=1, device="cuda")
        stats[graphs] = [algo.run_epoch() for _ in range(5)]
        if graphs:
            assert algo.step_graph.failure is None, algo.step_graph.failure
            assert len(algo.step_graph._graphs) == 2  # two shapes: 128 and 104 rows
            assert all(s.graphed for s in stats[True])
    for eager, graphed in zip(stats[False], stats[True], strict=True):
        print(f"epoch {eager.epoch}: loss eager {eager.loss_task:.6f} graphed "
              f"{graphed.loss_task:.6f}, mi {eager.mi_batch:.6f} / {graphed.mi_batch:.6f}")
    for eager, graphed in zip(stats[False], stats[True], strict=True):
        assert abs(eager.loss_task - graphed.loss_task) < 1e-3
        assert abs(eager.mi_batch - graphed.mi_batch) < 1e-2
        assert eager.guarded_frac == graphed.guarded_frac or (
            math.isnan(eager.guarded_frac) and math.isnan(graphed.guarded_frac))


def test_a_capture_that_fails_says_why_and_runs_eager():
    from unbiased.graphs import WARMUP_CALLS, GraphedStep

    total = torch.zeros((), device="cuda")

    def step(x):
        total.add_(x.sum())
        if float(total) < 0:  # a host sync: not allowed inside a capture
            total.zero_()
        return (total * 1,)

    graphed = GraphedStep(step)
    x = torch.ones(4, device="cuda")
    outs = [float(graphed(x)[0]) for _ in range(WARMUP_CALLS + 3)]
    assert outs == [4.0 * (i + 1) for i in range(WARMUP_CALLS + 3)]  # nothing lost or doubled
    assert graphed.failure is not None and not graphed.graphed


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_graphed_bundle_matches_the_eager_bundle(grey_digits, deterministic, amp):
    from unbiased.graphs import WARMUP_CALLS
    from unbiased.methods.bundle import MIBackpropBundle

    bench = _bench(grey_digits)
    results = {}
    for graphs in (False, True):
        members = [make_method("mi_backprop", bench, {**GRAPH_VALUES, "lam": lam,
                                                      "cuda_graphs": graphs, "amp": amp},
                               seed=seed, device="cuda")
                   for seed, lam in ((0, 0.0), (1, 1.0))]
        bundle = MIBackpropBundle(members, draws="batched")
        train = bench.train
        for step in range(WARMUP_CALLS + 4):
            rows = torch.arange(step * 128, (step + 1) * 128, device="cuda")
            x = torch.stack([train.x[rows]] * 2, dim=1)
            y, c = torch.stack([train.y[rows]] * 2), torch.stack([train.c[rows]] * 2)
            if bundle.step_graph is not None:
                bundle.step_graph(x, y, c)
            else:
                bundle.update(x, y, c, 1.0)
        bundle.sync_members()
        if graphs:
            assert bundle.step_graph.failure is None, bundle.step_graph.failure
            assert bundle.graphed() is True
        results[graphs] = [w for m in members for w in _weights(m)]
    largest = _weights_differ(results[False], results[True])
    print(f"graphed vs eager bundle: largest weight difference {largest:.3g}")
    assert largest < 1e-4


def test_graphed_fresh_critic_matches_the_eager_one(grey_digits, deterministic):
    from unbiased.mine import mi_eval

    bench = _bench(grey_digits)
    z = torch.randn(1024, 16, device="cuda") + bench.train.c[:, :1] * 2
    c, y = bench.train.c, bench.train.y
    for given in (None, y):
        eager = mi_eval(z, c, seed=4, steps=60, given=given)
        graphed = mi_eval(z, c, seed=4, steps=60, given=given, cuda_graphs=True)
        print(f"mi_eval eager {eager:.6f} graphed {graphed:.6f} (given: {given is not None})")
        assert abs(eager - graphed) < 1e-4
