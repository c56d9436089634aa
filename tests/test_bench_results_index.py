"""bench/results/README.md lists every folder of bench/results (what it holds, what rests on it)."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def test_every_results_folder_is_listed_in_its_readme():
    text = (RESULTS / "README.md").read_text()
    # an entry is "**name/**", or "**prefix\*/**" for a family of folders
    names = set(re.findall(r"\*\*([\w.-]+)/\*\*", text))
    prefixes = re.findall(r"\*\*([\w.-]+)\\\*/\*\*", text)
    folders = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    missing = [f for f in folders
               if f not in names and not any(f.startswith(p) for p in prefixes)]
    assert folders and not missing, f"bench/results/README.md does not list {missing}"
