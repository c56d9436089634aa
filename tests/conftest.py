"""Shared fixtures: one real local Ray per test session, small real data."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


@pytest.fixture(scope="session")
def ray_local():
    import ray

    # address="local": a fresh instance even when a `ray start` cluster runs on this machine
    # (tests/test_multinode.py, other sessions), never one found through ray_current_cluster.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def grey_digits():
    from unbiased.benchmarks.colored_mnist import load_mnist5k

    return load_mnist5k()


@pytest.fixture(scope="session")
def tiny_digits(grey_digits):
    """200 train / 100 test real digits: enough for a trial to run in seconds."""
    from unbiased.benchmarks.colored_mnist import GreyDigits

    d = grey_digits
    tr = list(range(0, len(d.train_y), 20))
    te = list(range(0, len(d.test_y), 10))
    return GreyDigits(d.train_x[tr], d.train_y[tr], d.test_x[te], d.test_y[te], "mnist5k")
