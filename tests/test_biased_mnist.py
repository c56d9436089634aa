"""Biased MNIST (ReBias): the colouring protocol on the embedded digits."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.conftest import ONE_AT_A_TIME, SMALL_NET
from tests.drivers import run_main
from unbiased.benchmarks.biased_mnist import data as bm
from unbiased.benchmarks.biased_mnist.spec import SPEC


@pytest.mark.parametrize("rho", [0.99, 0.997, 0.999])
def test_each_class_keeps_its_colour_at_rate_rho_and_spreads_the_rest(grey_digits, rho):
    y = grey_digits.train_y
    idx = bm.colour_classes(y, rho, torch.Generator().manual_seed(3))
    for label in range(bm.NUM_CLASSES):
        own = idx[y == label]
        n = len(own)
        assert int((own == label).sum()) == int(n * rho)
        rest = n - int(n * rho)
        counts = torch.bincount(own[own != label], minlength=bm.NUM_CLASSES)
        # Chunks of ceil(rest / 9), one per other colour, the last one shorter.
        assert counts.max() <= math.ceil(rest / 9)
        assert int(counts.sum()) == rest


def test_the_unbiased_test_set_spreads_every_class_over_all_colours(grey_digits):
    y = grey_digits.test_y
    idx = bm.colour_classes(y, bm.UNBIASED_RHO, torch.Generator().manual_seed(0))
    for label in range(bm.NUM_CLASSES):
        counts = torch.bincount(idx[y == label], minlength=bm.NUM_CLASSES)
        assert counts.min() >= 9 and counts.max() <= 11  # 100 test digits a class here


def test_the_digit_is_white_on_its_background_colour(grey_digits):
    grey = grey_digits.train_x[:20]
    idx = torch.arange(20) % bm.NUM_CLASSES
    x = bm.colourise(grey, idx)
    assert x.shape == (20, 3, 28, 28)
    on = grey > 0
    assert torch.all(x.permute(1, 0, 2, 3)[:, on] == 1)
    for i in range(20):
        colour = torch.tensor(bm.COLOURS[int(idx[i])]) / 255.0
        background = x[i][:, ~on[i]]
        assert torch.allclose(background, colour[:, None].expand_as(background))


def test_build_is_a_function_of_rho_and_seed(grey_digits):
    a = bm.build(grey_digits, 0.997, seed=1)
    b = bm.build(grey_digits, 0.997, seed=1)
    c = bm.build(grey_digits, 0.997, seed=2)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.c, b.train.c)
    assert not torch.equal(a.train.c, c.train.c)
    assert set(a.eval_splits) == {"test_acc", "biased_acc"}
    biased = a.eval_splits["biased_acc"]
    assert torch.equal(biased.c.argmax(1), biased.y)
    assert a.c_dim == bm.NUM_CLASSES and a.bias_classes == (bm.NUM_CLASSES,)
    assert bm.colour_only_accuracy(grey_digits, 0.99, seed=1) == pytest.approx(0.99, abs=1e-3)


@pytest.mark.parametrize("rho", [0.0, -0.1, 1.5])
def test_a_rho_outside_the_unit_interval_is_refused(grey_digits, rho):
    with pytest.raises(ValueError, match="rho"):
        bm.build(grey_digits, rho, seed=0)


# ------------------------------------------------------------- one module + one registry line

ROOT = Path(__file__).resolve().parents[1]


def test_the_registry_lists_it_and_its_spec_reads_without_torch():
    code = (
        "import sys\n"
        "from unbiased.benchmarks import BENCHMARKS, benchmark_spec\n"
        "from analysis.specs import TABLE_SPECS\n"
        "import sweeps.cli\n"
        "spec = benchmark_spec('biased_mnist')\n"
        "assert 'biased_mnist' in BENCHMARKS and TABLE_SPECS['biased_mnist'] is spec.table\n"
        "assert spec.data_axes == ('rho',) and 'biased_acc' in spec.columns\n"
        "assert {p.row for p in spec.table.published} >= {'Vanilla', 'ReBias'}\n"
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]\n"
        "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_its_presets_take_the_digits_presets_method_and_training_values():
    from unbiased.benchmarks import benchmark_spec

    digits, own = benchmark_spec("digits").presets, SPEC.presets
    for name, rhos, source in (("quick", [0.99, 0.997], "mnist5k"),
                               ("cpu", [0.997, 0.999], "mnist")):
        expected = {k: v for k, v in digits[name].items()
                    if k not in ("sigma", "palette", "stroke")}
        expected.update(source=source, rho=rhos, lam=[0.0, 1.0], seeds=[0])
        assert own[name] == expected


def test_a_dry_run_lists_the_grid_without_a_driver_file(capsys, tmp_path):
    from sweeps.__main__ import main

    assert main(["biased_mnist", "--dry-run", "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("biased_mnist_grid: preset quick, 4 trials, 8 epochs each")
    assert lines[1].split() == ["method", "rho", "lam", "K", "seed"]
    assert [line.split()[1:3] for line in lines[2:6]] == [
        ["0.99", "0.0"], ["0.99", "1.0"], ["0.997", "0.0"], ["0.997", "1.0"]]
    assert not (tmp_path / "out").exists()


def test_a_rho_outside_the_unit_interval_is_refused_by_the_flag(capsys):
    from sweeps.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["biased_mnist", "--rho", "0.99,1.5", "--dry-run"])
    assert exit_.value.code == 2
    assert "argument --rho: 1.5: must be in (0, 1]" in capsys.readouterr().err


def test_the_benchmark_is_one_package_and_one_registry_line():
    """Outside tests and docs, the name appears in its own package and the registry only:
    the sweeps, trainables, runner and analysis read the registry."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    code = [f for f in files if f.endswith(".py") and not f.startswith(("tests/", "docs/"))]
    naming = sorted(f for f in code if "biased_mnist" in (ROOT / f).read_text())
    package = "unbiased/benchmarks/biased_mnist/"
    assert [f for f in naming if not f.startswith(package)] == ["unbiased/benchmarks/__init__.py"]
    registry = (ROOT / "unbiased/benchmarks/__init__.py").read_text()
    assert sum("biased_mnist" in line for line in registry.splitlines()) == 1


@pytest.mark.ray
def test_a_tiny_sweep_writes_biased_acc_and_the_published_rows(ray_local, tmp_path):
    # `python -m sweeps biased_mnist` in this process, on the session's Ray (tests/drivers.py)
    out = tmp_path / "out"
    proc = run_main("__main__", "biased_mnist", "--preset", "quick", "--rho", "0.99",
                    "--epochs", "1", "--K", "2", "--mi-eval-steps", "20", *SMALL_NET,
                    *ONE_AT_A_TIME, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    df = pd.read_parquet(out / "results.parquet")
    assert set(df["benchmark"]) == {"biased_mnist"} and set(df["rho"]) == {0.99}
    assert df["biased_acc"].between(0, 1).all() and len(df) == 2
    md = (out / "table.md").read_text()
    assert "## biased_mnist: Biased MNIST (ReBias Table 1)" in md
    assert "| ReBias (published) |" in md and "ρ=0.990" in md
    assert "quick preset: 4,000 training digits (mnist5k), 1 epochs" in md
