"""--cuda-graphs where no capture can happen: the obstacles are said once and the trial runs
eager with the numbers it has without the option, and reports graphed = False. The captures
themselves (graphed against eager, bit for bit in deterministic mode; a failed capture) are
tests/test_gpu.py's."""

from __future__ import annotations

import torch

from tests.trials import run_recorded
from unbiased.methods import make_method
from unbiased.methods.mi_backprop import MIBackpropConfig, mi_backprop_graph_obstacles
from unbiased.mine import mi_eval

SMALL = {"lam": 1.0, "batch_size": 64, "lr": 1e-3, "K": 3, "inner_z": "batch",
         "theta_update": "separate", "mine_ema_rate": 0.01, "mine_standardize": True,
         "mi_guard": True, "mine_lr": 1e-3}


def _small_bench(grey_digits):
    from unbiased.benchmarks.digits.data import GreyDigits, build

    d = grey_digits
    digits = GreyDigits(d.train_x[:300], d.train_y[:300], d.test_x[:100], d.test_y[:100],
                        "mnist5k")
    return build(digits, 0.03, seed=0)


def test_obstacles_name_each_setting_a_capture_cannot_take():
    cuda = torch.device("cuda")
    assert mi_backprop_graph_obstacles(MIBackpropConfig(inner_z="batch"), cuda) == []
    reasons = mi_backprop_graph_obstacles(
        MIBackpropConfig(inner_z="fresh", lr_schedule="cosine", epochs=3, amp=True,
                         compile=True), torch.device("cpu"))
    # bf16 autocast is capturable (its weight cache is off): not an obstacle
    assert [r.split()[0] for r in reasons] == ["the", "--inner-z", "--lr-schedule",
                                               "--compile"]
    assert "cpu" in reasons[0]


def test_on_cpu_the_option_says_why_and_changes_no_number(grey_digits, capsys):
    bench = _small_bench(grey_digits)
    runs = {}
    for graphs in (False, True):
        algo = make_method("mi_backprop", bench, {**SMALL, "cuda_graphs": graphs}, seed=2)
        stats = algo.run_epoch()
        runs[graphs] = (stats, [p.detach().clone() for p in algo.g.parameters()], algo)
    said = capsys.readouterr().out
    assert said.count("cuda graphs: off (the device is cpu, not cuda)") == 1
    (plain, plain_w, _), (asked, asked_w, algo) = runs[False], runs[True]
    assert algo.step_graph is None
    assert plain.graphed is None and asked.graphed is False
    assert asked.loss_task == plain.loss_task and asked.mi_batch == plain.mi_batch
    assert all(torch.equal(a, b) for a, b in zip(plain_w, asked_w, strict=True))
    assert algo.theta_steps == -(-300 // 64)  # counted once a step, outside the step itself


def test_a_trial_reports_graphed_each_epoch(tiny_digits):
    config = {"sigma": 0.03, "seed": 0, "epochs": 2, "device": "cpu", "num_threads": 1,
              "mi_eval_steps": 10, **SMALL, "cuda_graphs": True}
    trial = run_recorded("digits", config, digits=tiny_digits)
    assert trial.error is None
    assert list(trial.reports["graphed"]) == [False, False]
    plain = run_recorded("digits", {**config, "cuda_graphs": False}, digits=tiny_digits)
    assert "graphed" not in plain.reports
    assert plain.reports["test_acc"].equals(trial.reports["test_acc"])


def test_fresh_critic_without_a_gpu_is_the_eager_one():
    gen = torch.Generator().manual_seed(0)
    c = torch.nn.functional.one_hot(torch.randint(3, (400,), generator=gen), 3).float()
    z = torch.randn(400, 4, generator=gen) + c[:, :1]
    assert mi_eval(z, c, seed=1, steps=20, cuda_graphs=True) == mi_eval(z, c, seed=1,
                                                                        steps=20)
