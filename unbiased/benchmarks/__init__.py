"""The benchmark registry: one line per benchmark, its name -> the module whose `SPEC`
(unbiased.benchmarks.spec.BenchmarkSpec) says everything it brings.

The sweeps (`python -m sweeps NAME`), the generic trainable (trainables/benchmark.py), the
results columns and the analysis's tables all read this registry. Importing it, or a spec
module it names, must not import torch or ray: the analysis reads the specs torch-free. A
spec module imports its data code (torch) inside the functions that need it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unbiased.benchmarks.spec import BenchmarkSpec

BENCHMARKS: dict[str, str] = {
    "digits": "unbiased.benchmarks.digits",
    "german": "unbiased.benchmarks.german",
    "imdb": "unbiased.benchmarks.imdb",
    "biased_mnist": "unbiased.benchmarks.biased_mnist",
}
# Benchmarks kept outside this package, "NAME=module[,NAME=module]" (each module holds its
# SPEC, importable where the sweep runs). A local sweep's Ray workers inherit the driver's
# environment; a cluster's get it through the head's environment or a runtime_env.
EXTRA_BENCHMARKS_ENV = "UNBIASED_BENCHMARKS"


def registered() -> dict[str, str]:
    """Every benchmark name -> its spec module: the package's, then those of
    UNBIASED_BENCHMARKS."""
    extra = {}
    for item in filter(None, (part.strip() for part in
                              os.environ.get(EXTRA_BENCHMARKS_ENV, "").split(","))):
        name, _, module = (s.strip() for s in item.partition("="))
        if not name or not module:
            raise ValueError(f"{EXTRA_BENCHMARKS_ENV}: {item!r} is not NAME=module")
        extra[name] = module
    return {**BENCHMARKS, **extra}


def benchmark_spec(name: str) -> BenchmarkSpec:
    """The registered benchmark's spec (its module imported on first use)."""
    modules = registered()
    if name not in modules:
        raise KeyError(f"unknown benchmark {name!r}; registered: {', '.join(modules)}")
    spec = importlib.import_module(modules[name]).SPEC
    if spec.name != name:
        raise ValueError(f"{modules[name]}.SPEC is named {spec.name!r}, registered as "
                         f"{name!r}")
    return spec


def all_specs() -> list[BenchmarkSpec]:
    """Every registered benchmark's spec, in the registry's order."""
    return [benchmark_spec(name) for name in registered()]
