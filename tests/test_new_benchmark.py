"""A benchmark added as a contributor would, with no edit of sweeps/, trainables/, analysis/ or
a test: one module outside the package, named in UNBIASED_BENCHMARKS, with a setting of its
own and no published rows. It shows in `--help`, refuses a bad value of its setting, runs a
one-epoch sweep (its trials import it in Ray's workers) and goes through the analysis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]

TOY = '''
from dataclasses import dataclass

from unbiased.benchmarks.spec import BenchmarkSpec, Column, TableSpec
from unbiased.settings import setting


@dataclass
class ToySettings:
    spread: float = setting(0.5, "noise around each class's mean (toy)", gt=0)


def load(values):
    return {}, "toy rows, made in each trial"


def build(config):
    import torch
    from torch import nn

    from unbiased.data import Benchmark, TensorSplit

    gen = torch.Generator().manual_seed(int(config["seed"]))

    def split(n):
        y = torch.randint(2, (n,), generator=gen)
        c = torch.nn.functional.one_hot(y, 2).float()
        x = torch.randn(n, 4, generator=gen) * float(config["spread"]) + y[:, None].float()
        return TensorSplit(x, y, c)

    return Benchmark(name="toy", train=split(256), eval_splits={"test_acc": split(128)},
                     num_classes=2, z_dim=8, c_dim=2,
                     make_features=lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU()))


SPEC = BenchmarkSpec(
    name="toy", title="Toy", description="A toy grid: lambda x seed.",
    presets={"quick": {"lam": [0.0, 1.0], "seeds": [0], "epochs": 1, "batch_size": 32,
                       "K": 2, "lr": 1e-3, "mine_lr": 1e-3, "inner_z": "batch",
                       "cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "device": "cpu",
                       "mi_eval_steps": 10}},
    data_axes=(), build_keys=("spread",), load=load, build=build, settings=ToySettings,
    table=TableSpec(benchmark="toy", name="Toy", table="no paper table", measures="accuracy",
                    columns=(Column("Acc.", ("test_acc",)),), published=()))
'''


def _run(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.ray
def test_a_benchmark_from_outside_the_package_runs_end_to_end(tmp_path):
    (tmp_path / "toy_bench.py").write_text(TOY)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(UNBIASED_BENCHMARKS="toy=toy_bench", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT),
                                           env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    shown = _run(env, "-m", "sweeps", "toy", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "--spread SPREAD" in shown.stdout and "noise around each class" in shown.stdout
    assert "toy" in _run(env, "-m", "sweeps").stdout.splitlines()[0]

    refused = _run(env, "-m", "sweeps", "toy", "--spread", "-1", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "error: argument --spread: -1: must be > 0")
    assert not (tmp_path / "x").exists()

    out = tmp_path / "toy"
    ran = _run(env, "-m", "sweeps", "toy", "--preset", "quick", "--spread", "0.3",
               "--out", str(out))
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    df = pd.read_parquet(out / "results.parquet")
    assert sorted(df["lam"]) == [0.0, 1.0] and set(df["epoch"]) == {1}
    assert set(df["benchmark"]) == {"toy"} and df["test_acc"].notna().all()
    table = (out / "table.md").read_text()
    assert "No published rows for this table." in table

    (out / "table.md").unlink()
    analysed = _run(env, "-m", "analysis", str(out), "--no-figures")
    assert analysed.returncode == 0, analysed.stderr
    assert "No published rows for this table." in (out / "table.md").read_text()
