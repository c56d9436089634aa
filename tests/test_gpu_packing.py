"""bench/gpu_packing.py projects the paper preset's GPU time: it must time the preset's own
trial (method settings and the stopping rule's fresh critics), whatever the preset becomes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from unbiased.benchmarks.digits.spec import DIGITS
from unbiased.methods import method_config

PATH = Path(__file__).resolve().parents[1] / "bench" / "gpu_packing.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_packing", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_packing"] = module
    spec.loader.exec_module(module)
    return module


def test_packing_times_the_paper_presets_own_trial():
    packing = _module()
    _, opts = packing.parse([])
    paper = DIGITS["paper"]
    ours = method_config("mi_backprop", packing.trial_values(opts))
    preset = method_config("mi_backprop", {**paper, "lam": 1.0, "K": paper["K"]})
    assert ours == preset
    assert opts["mi_eval_steps"] == paper["mi_eval_steps"]


def test_packing_counts_the_stopping_rules_critics():
    packing = _module()
    paper = DIGITS["paper"]
    no_critic = packing.trial_seconds(0.01, 1.0, 0.0, int(paper["batch_size"]))
    with_critic = packing.trial_seconds(0.01, 1.0, 1.0, int(paper["batch_size"]))
    assert with_critic - no_critic == pytest.approx(150 // int(paper["mi_eval_every"]) * 4 + 2)
