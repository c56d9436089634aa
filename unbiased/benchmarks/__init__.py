"""The benchmark registry: one line per benchmark, its name -> the module whose `SPEC`
(unbiased.benchmarks.spec.BenchmarkSpec) says everything it brings.

The sweeps (`python -m sweeps NAME`), the generic trainable (trainables/benchmark.py), the
results columns and the analysis's tables all read this registry. Importing it, or a spec
module it names, must not import torch or ray: the analysis reads the specs torch-free. A
spec module imports its data code (torch) inside the functions that need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unbiased.benchmarks.spec import BenchmarkSpec

BENCHMARKS: dict[str, str] = {
    "digits": "unbiased.benchmarks.digits",
    "german": "unbiased.benchmarks.german_credit",
    "imdb": "unbiased.benchmarks.imdb_faces",
    "biased_mnist": "unbiased.benchmarks.biased_mnist",
}


def benchmark_spec(name: str) -> BenchmarkSpec:
    """The registered benchmark's spec (its module imported on first use)."""
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; registered: {', '.join(BENCHMARKS)}")
    spec = importlib.import_module(BENCHMARKS[name]).SPEC
    if spec.name != name:
        raise ValueError(f"{BENCHMARKS[name]}.SPEC is named {spec.name!r}, registered as "
                         f"{name!r}")
    return spec


def all_specs() -> list[BenchmarkSpec]:
    """Every registered benchmark's spec, in the registry's order."""
    return [benchmark_spec(name) for name in BENCHMARKS]
