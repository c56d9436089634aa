"""table.md, table.parquet and table.tex of fixed results, byte for byte as committed.

The inputs and goldens live in tests/fixtures/tables/<case>/ (tests/fixtures/tables/
make_inputs.py says what each is and how they were made): the real Table 1, German credit
at the paper's settings, `make quick`'s digits grid, and the synthetic demo of all three
benchmarks. A change to the tables that is meant rewrites the goldens with
`make_inputs.py --golden` and says in its commit why they changed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import build_all

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tables"
CASES = ("table1", "german", "quick", "demo")
INPUTS = ("results.parquet", "experiment.json")


@pytest.mark.parametrize("case", CASES)
def test_tables_match_the_golden_files(case: str, tmp_path: Path) -> None:
    source = FIXTURES / case
    for name in INPUTS:
        if (source / name).is_file():
            shutil.copy(source / name, tmp_path / name)
    build_all(tmp_path, figures=False)
    for name in ("table.md", "table.tex"):
        got, want = (tmp_path / name).read_text(), (source / name).read_text()
        assert got == want, f"{case}/{name} differs from the golden file"
    got, want = (pd.read_parquet(d / "table.parquet") for d in (tmp_path, source))
    assert list(got.dtypes) == list(want.dtypes), case
    assert got.equals(want), f"{case}/table.parquet differs from the golden file"
