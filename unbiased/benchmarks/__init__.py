"""The benchmark registry: name -> the module whose `SPEC` says everything it brings.

Importing it, or a spec module it names, must not import torch or ray: the analysis reads
the specs torch-free.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from unbiased.method_catalogue import catalogue
from unbiased.registry_error import RegistryError

if TYPE_CHECKING:
    from unbiased.benchmarks.spec import BenchmarkSpec

BENCHMARKS: dict[str, str] = {
    "digits": "unbiased.benchmarks.digits.spec",
    "german": "unbiased.benchmarks.german.spec",
    "imdb": "unbiased.benchmarks.imdb.spec",
    "biased_mnist": "unbiased.benchmarks.biased_mnist.spec",
}
# Other installed packages' benchmarks: an entry point `NAME = "package.module"`.
ENTRY_POINTS = "unbiased.benchmarks"
# "NAME=module[,NAME=module]". A cluster's Ray workers get it through the head's environment
# or a runtime_env.
EXTRA_BENCHMARKS_ENV = "UNBIASED_BENCHMARKS"


def registered() -> dict[str, str]:
    out = dict(BENCHMARKS)

    def add(name: str, module: str, source: str) -> None:
        if name in out:
            raise RegistryError(f"{source}: benchmark {name!r} is registered already (by "
                                f"{out[name]})")
        out[name] = module

    for point in entry_points(group=ENTRY_POINTS):
        add(point.name, point.value.strip(), f"entry point {point.name} = {point.value} "
                                             f"(group {ENTRY_POINTS})")
    for item in filter(None, (part.strip() for part in
                              os.environ.get(EXTRA_BENCHMARKS_ENV, "").split(","))):
        name, _, module = (s.strip() for s in item.partition("="))
        if not name or not module:
            raise RegistryError(f"{EXTRA_BENCHMARKS_ENV}: {item!r} is not NAME=module "
                                f"(e.g. {EXTRA_BENCHMARKS_ENV}=toy=my_benchmarks.toy)")
        add(name, module, f"{EXTRA_BENCHMARKS_ENV}={item}")
    return out


def benchmark_spec(name: str) -> BenchmarkSpec:
    modules = registered()
    if name not in modules:
        raise KeyError(f"unknown benchmark {name!r}; registered: {', '.join(modules)}")
    module = modules[name]
    try:
        spec = importlib.import_module(module).SPEC
    except ImportError as exc:
        raise RegistryError(f"benchmark {name!r}: cannot import its module {module} "
                            f"({type(exc).__name__}: {exc})") from None
    except AttributeError:
        raise RegistryError(f"benchmark {name!r}: module {module} holds no SPEC") from None
    if spec.name != name:
        raise RegistryError(f"{module}.SPEC is named {spec.name!r}, registered as {name!r}")
    return spec


def all_specs() -> list[BenchmarkSpec]:
    return [benchmark_spec(name) for name in registered()]


def exit_on_bad_registry() -> None:
    """A bad registry is one `error:` line and exit status 2, not a traceback."""
    try:
        all_specs()
        catalogue()  # the methods of installed packages
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
