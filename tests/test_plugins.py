"""A benchmark or a method of another installed package registers through its entry points
(unbiased/benchmarks/__init__.py, unbiased/method_catalogue.py) with no edit here, tested with
a real distribution's metadata on the path of a fresh interpreter; a registry that cannot be
read is one `error:` line and exit 2 from every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_new_benchmark import TOY

ROOT = Path(__file__).resolve().parents[1]

CATALOGUE = '''
from unbiased.method_catalogue import MethodEntry

ENTRY = MethodEntry("toyplug.method", "Halved", "Halved loss (plug-in)", "a toy plug-in")
'''
METHOD = '''
import torch.nn.functional as F

from unbiased.methods.base import ERM, TrainConfig


class Halved(ERM):
    """penalty: half the task loss (a toy)."""

    name = "halved"
    Config = TrainConfig

    def update(self, x, y, c, rows, train):
        loss = F.cross_entropy(self.f(self._features(x)), y)
        return self.task_step(loss, lambda detach: 0.5 * (loss.detach() if detach else loss))
'''
ENTRY_POINTS = '''[unbiased.benchmarks]
toyb = toyplug.bench

[unbiased.methods]
halved = toyplug.catalogue:ENTRY
'''
CHECK = '''
import sys

from analysis.published import METHOD_LABELS

assert "torch" not in sys.modules  # the label comes torch-free
assert METHOD_LABELS["halved"] == "Halved loss (plug-in)"
from unbiased.benchmarks import benchmark_spec, registered
from unbiased.methods import METHODS, make_method

assert list(registered())[-1] == "toyb" and METHODS["halved"].__name__ == "Halved"
bench = benchmark_spec("toyb").build({"seed": 0, "spread": 0.5})
algo = make_method("halved", bench, {"lam": 1.0, "batch_size": 32}, seed=0)
print("trained", algo.run_epoch().penalty > 0)
from sweeps.__main__ import main

sys.exit(main(["toyb", "--method", "halved", "--lam", "0,1", "--dry-run"]))
'''


def _distribution(root: Path) -> Path:
    """An installed package `toyplug` as pip leaves one: the modules and a dist-info folder
    whose entry_points.txt names a benchmark and a method."""
    pkg = root / "toyplug"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bench.py").write_text(TOY.replace('name="toy"', 'name="toyb"'))
    (pkg / "catalogue.py").write_text(CATALOGUE)
    (pkg / "method.py").write_text(METHOD)
    info = root / "toyplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


def test_an_installed_packages_benchmark_and_method_register_by_entry_points(tmp_path):
    site = _distribution(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    env.pop("UNBIASED_BENCHMARKS", None)
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trained True" in proc.stdout
    assert "toyb_grid: preset quick, 2 trials" in proc.stdout, proc.stdout
    assert proc.stdout.count("halved") >= 2  # each trial's row names the plug-in method


def test_a_name_registered_twice_is_one_error_line(tmp_path):
    site = _distribution(tmp_path / "site")
    entry = site / "toyplug-0.1.dist-info" / "entry_points.txt"
    entry.write_text(ENTRY_POINTS.replace("toyb = ", "digits = "))
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", "import analysis"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: entry point digits = toyplug.bench (group unbiased.benchmarks): benchmark "
        "'digits' is registered already (by unbiased.benchmarks.digits.spec)"]


@pytest.mark.ray
@pytest.mark.parametrize("value, says", [
    ("garbage", "error: UNBIASED_BENCHMARKS: 'garbage' is not NAME=module (e.g. "
                "UNBIASED_BENCHMARKS=toy=my_benchmarks.toy)"),
    ("foo=nosuch.module", "error: benchmark 'foo': cannot import its module nosuch.module "
                          "(ModuleNotFoundError: No module named 'nosuch')"),
])
@pytest.mark.parametrize("command", [
    ["-m", "sweeps", "digits", "--dry-run"], ["sweeps/digits_grid.py", "--help"],
    ["sweeps/export_epochs.py", "in.csv", "out.csv"], ["-m", "analysis", "results/x"],
], ids=["python -m sweeps", "a driver", "export", "python -m analysis"])
def test_a_malformed_registry_is_one_error_line_from_every_command(tmp_path, value, says,
                                                                   command):
    env = {**os.environ, "UNBIASED_BENCHMARKS": value}
    proc = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [says]
