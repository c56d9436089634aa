"""`python -m analysis`, the results contract checks, atomic writes, and import hygiene."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.io import atomic_write, atomic_write_bytes, atomic_write_text
from analysis.results import ResultsError, load_results, validate
from tests.synthetic import frame, trial

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analysis", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def good_frame() -> pd.DataFrame:
    return frame(trial(lam=0.0, mi=1.0) + trial(lam=1.0, mi=0.1, test_acc=0.9))


def assert_one_line_error(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == f"error: {expected}"


def test_missing_column_names_it(tmp_path: Path) -> None:
    good_frame().drop(columns=["lam"]).to_parquet(tmp_path / "results.parquet")
    with pytest.raises(ResultsError, match="^results.parquet: column 'lam' is missing$"):
        load_results(tmp_path)
    assert_one_line_error(run_cli(str(tmp_path)), "results.parquet: column 'lam' is missing")


def test_wrong_dtype_names_it(tmp_path: Path) -> None:
    df = good_frame()
    df["epoch"] = df["epoch"].astype(str).astype(object)
    df.to_parquet(tmp_path / "results.parquet")
    proc = run_cli(str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("error: results.parquet: column 'epoch' has dtype ")
    assert line.endswith(", expected integer") and "\n" not in line


@pytest.mark.parametrize(("column", "value", "message"), [
    ("epoch", "1", "column 'epoch' has dtype object, expected integer"),
    ("K", 80.0, "column 'K' has dtype float64, expected integer"),
    ("mi", "high", "column 'mi' has dtype object, expected float"),
    ("lam", True, "column 'lam' has dtype bool, expected float"),
    ("trial_id", 7, "column 'trial_id' has dtype int64, expected string"),
    ("eo", "x", "column 'eo' has dtype object, expected float"),  # optional, checked if present
])
def test_validate_dtypes(column: str, value: object, message: str) -> None:
    df = good_frame()
    df[column] = pd.Series([value] * len(df), dtype=object if isinstance(value, str) else None)
    with pytest.raises(ResultsError, match=f"^results.parquet: {message}$"):
        validate(df)


def test_validate_accepts_contract_variants() -> None:
    df = good_frame()
    df["lam"] = df["lam"].astype("int64")  # an integer lambda grid widens to float
    df["trial_id"] = df["trial_id"].astype("string")
    df["sigma"] = pd.Series([None] * len(df), dtype=object)  # an all-null column
    out = validate(df)
    assert out["lam"].dtype == "float64" and out["sigma"].isna().all()


def test_missing_results_file(tmp_path: Path) -> None:
    proc = run_cli(str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "results.parquet" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_success(tmp_path: Path) -> None:
    good_frame().to_parquet(tmp_path / "results.parquet")
    proc = run_cli(str(tmp_path), "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"wrote {tmp_path / 'table.md'}",
                                        f"wrote {tmp_path / 'table.parquet'}",
                                        f"wrote {tmp_path / 'table.tex'}"]


def test_atomic_write_keeps_old_file_when_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "table.md"
    atomic_write_text(target, "old contents\n")

    def broken(tmp: Path) -> None:
        with open(tmp, "w") as handle:
            handle.write("half of the new")
            handle.flush()
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, broken)
    assert target.read_text() == "old contents\n"
    assert os.listdir(tmp_path) == ["table.md"]  # no temp file left behind
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["table.md"]


def test_analysis_never_imports_torch_or_ray() -> None:
    code = ("import analysis, analysis.figures, analysis.tables, analysis.__main__, sys; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_unknown_benchmark_names_the_known_ones() -> None:
    df = good_frame()
    df["benchmark"] = "mnist"
    from unbiased.benchmarks import registered

    *rest, last = registered()
    with pytest.raises(ResultsError, match=f"^results.parquet: column 'benchmark' has unknown "
                                           f"value 'mnist', expected {', '.join(rest)} or "
                                           f"{last}$"):
        validate(df)
