"""`--fetch-data` (sweeps/fetch.py): a benchmark's data fetched or checked on a machine with
network, printed, exit 0, no Ray, no OUT; data the program cannot download, or no network:
one `error:` line, exit 2, naming what to do; and a sweep whose data is missing and cannot be
downloaded names the command that fetches it.

"No network" is made deterministic by proxies nobody listens on (`http_proxy`, `https_proxy`,
which torchvision's downloads honour through urllib): every download fails at once, on any
machine. Those checks run in a process of their own (urllib reads the proxies once per
process); the others call the driver's `main` here (tests/drivers.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.drivers import run_main, run_sweep
from tests.test_colored_mnist import tiny_mnist

ROOT = Path(__file__).resolve().parents[1]
# A port nothing listens on: the download's connection is refused at once.
DEAD_PROXY = "http://127.0.0.1:9"


def _offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
    env.update(http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY, HTTP_PROXY=DEAD_PROXY,
               HTTPS_PROXY=DEAD_PROXY)
    return env


def _offline(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
                          env=_offline_env(), timeout=300)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.ray
def test_fetch_reads_the_data_already_under_root_without_a_download(tmp_path):
    raw = tiny_mnist(tmp_path / "data")
    before = sorted(p.name for p in raw.iterdir())
    proc = _offline("sweeps/digits_grid.py", "--preset", "cpu", "--fetch-data", "--root",
                    str(tmp_path / "data"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr.lower() and "Traceback" not in proc.stderr
    assert f"full MNIST in {raw} (there already, read)" in proc.stdout
    for name in before:
        assert f"{name}  {(raw / name).stat().st_size:,} bytes" in proc.stdout, name
    assert "20 train / 10 test digits" in proc.stdout
    assert sorted(p.name for p in raw.iterdir()) == before  # nothing downloaded
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_fetch_without_network_is_one_error_line_naming_the_command(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    proc = _offline("-m", "sweeps", "digits", "--preset", "paper", "--fetch-data", "--root",
                    str(empty), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = _error_lines(proc.stderr)
    assert errors == [proc.stderr.strip().splitlines()[-1]], proc.stderr
    line = errors[0]
    assert line.startswith(f"error: MNIST not found under {empty} and could not be downloaded")
    assert (f"on a machine with internet (the login node): python -m sweeps digits --preset "
            f"paper --fetch-data --root {empty}, then run the sweep with --root {empty}") in line
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
@pytest.mark.parametrize("driver, name", [("digits", "digits"),
                                          ("biased_mnist", "biased_mnist")])
def test_sweep_with_missing_data_and_no_network_names_the_fetch_command(tmp_path, driver,
                                                                        name):
    empty = tmp_path / "data"
    empty.mkdir()
    out = tmp_path / "out"
    proc = _offline("-m", "sweeps", driver, "--preset", "cpu", "--root", str(empty),
                    "--seeds", "0", "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = _error_lines(proc.stderr)
    assert errors == [proc.stderr.strip().splitlines()[-1]], proc.stderr
    assert errors[0].startswith(f"error: MNIST not found under {empty} and could not be "
                                f"downloaded there (")
    assert errors[0].endswith(
        f"fetch it on a machine with internet (the login node): python -m sweeps {name} "
        f"--preset cpu --fetch-data --root {empty}, then run the sweep with --root {empty}")
    assert "trials (" not in proc.stdout  # the start line: Ray never started
    assert not out.exists()


@pytest.mark.ray
def test_the_embedded_subset_has_nothing_to_fetch(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    ran = run_main("digits_grid", "--fetch-data", "--root", str(root), "--out",
                   str(tmp_path / "out"))
    assert ran.returncode == 0 and ran.stderr == ""
    assert "nothing to fetch: source mnist5k" in ran.stdout
    assert "4,000 train / 1,000 test digits" in ran.stdout
    assert list(root.iterdir()) == [] and not (tmp_path / "out").exists()


@pytest.mark.ray
def test_german_fetch_checks_a_root_copy_and_refuses_to_download(tmp_path):
    from unbiased.benchmarks.german import data as german_credit

    ran = run_sweep("german", "--fetch-data")
    assert ran.returncode == 0
    assert (f"nothing to fetch: German credit is the UCI file shipped in the package, "
            f"{german_credit.SHIPPED_FILE}") in ran.stdout

    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(german_credit.SHIPPED_FILE, copy / german_credit.FILE_NAME)
    ran = run_sweep("german", "--fetch-data", "--root", str(copy))
    assert ran.returncode == 0, ran.stderr
    assert "(79,793 bytes, 1000 rows, the UCI file's md5)" in ran.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    ran = run_sweep("german", "--fetch-data", "--root", str(empty), "--out",
                   str(tmp_path / "out"))
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [ran.stderr.strip()]  # one line
    assert "does not download it" in ran.stderr and german_credit.DOWNLOAD_URL in ran.stderr
    assert list(empty.iterdir()) == [] and not (tmp_path / "out").exists()


@pytest.mark.ray
def test_imdb_fetch_checks_the_release_and_says_where_to_get_it(tmp_path):
    from tests.test_imdb import write_fake_imdb
    from unbiased.benchmarks.imdb import data as imdb_faces

    write_fake_imdb(tmp_path / "faces")
    ran = run_sweep("imdb", "--fetch-data", "--weights", "none", "--root",
                   str(tmp_path / "faces"))
    assert ran.returncode == 0, ran.stderr
    assert "backbone weights: none (random init), nothing to fetch" in ran.stdout
    assert "imdb.mat" in ran.stdout and "IMDB splits: EB1" in ran.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    ran = run_sweep("imdb", "--fetch-data", "--weights", "none", "--root", str(empty))
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [ran.stderr.strip()]
    assert ran.stderr.startswith("error: this program does not download IMDB faces")
    assert imdb_faces.DOWNLOAD_URL in ran.stderr


@pytest.mark.ray
def test_a_root_that_does_not_exist_names_the_fetch_command(tmp_path):
    nowhere = tmp_path / "nowhere"
    ran = run_main("digits_grid", "--preset", "cpu", "--root", str(nowhere), "--out",
                   str(tmp_path / "out"))
    assert ran.returncode == 2
    last = ran.stderr.strip().splitlines()[-1]
    assert f"argument --root: {nowhere} does not exist" in last
    assert f"`python -m sweeps digits --preset cpu --fetch-data --root {nowhere}`" in last
    assert not nowhere.exists() and not (tmp_path / "out").exists()


def test_every_benchmark_driver_names_its_own_fetch_command():
    """The fetch command an error names is `python -m sweeps NAME` of the driver that ran."""
    from sweeps.cli import driver_command, fetch_command
    from sweeps.core import benchmark_grid
    from sweeps.digits_grid import GRID
    from unbiased.benchmarks import registered

    # The two drivers run as files: lambda_search.py's main's parser, digits_grid.py's.
    assert driver_command("lambda_search.py") == "python -m sweeps lambda_search"
    assert driver_command(GRID.prog) == "python -m sweeps digits"
    for name in registered():  # a benchmark's grid's prog is its own command
        assert driver_command(benchmark_grid(name).prog) == f"python -m sweeps {name}"
    # A benchmark's fetch keys given on the command line go into the command.
    command = fetch_command("python -m sweeps imdb", "imdb", "paper",
                            {"arch": "resnet18", "root": "/d a"}, {"arch"})
    assert command == ("python -m sweeps imdb --preset paper --arch resnet18 --fetch-data "
                       "--root '/d a'")


def test_missing_weights_name_where_the_fetch_puts_them():
    from sweeps.fetch import missing_data
    from unbiased.data import DataError, DataMissing

    plain = DataError("imdb.mat not found")
    assert missing_data(plain, "CMD", "R") == "imdb.mat not found"
    weights = DataMissing("weights not there", fetched_to="/hub/r50.pth")
    line = missing_data(weights, "python -m sweeps imdb --preset quick --fetch-data", "R")
    assert line.startswith("weights not there; or on a machine with internet")
    assert "python -m sweeps imdb --preset quick --fetch-data puts them in /hub/r50.pth" in line
    assert "--root R" not in line
