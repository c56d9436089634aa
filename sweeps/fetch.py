"""`--fetch-data`: a sweep's data fetched (or checked) on a machine with network, such as a
cluster's login node, for sweeps on nodes without it; and the line a sweep whose data is
missing ends on, naming that command (the sweep's own driver, preset and --root); the
commands: docs/CLUSTER.md.
"""

from __future__ import annotations

import sys
from shlex import quote


def run_fetch(benchmark: str, preset: str, values: dict, command: str) -> int:
    """Fetch (or check) what a sweep of `values` reads; exit status 0, or 2 after one line."""
    from unbiased.benchmarks import benchmark_spec
    from unbiased.data import DataError

    spec = benchmark_spec(benchmark)
    print(f"{benchmark}, preset {preset}: the data a sweep with these settings reads",
          flush=True)
    try:
        if spec.fetch is not None:
            for line in spec.fetch(dict(values)):
                print(line, flush=True)
        else:
            _, said = spec.load(dict(values))
            print(f"no fetch step of its own: loaded as a sweep loads it ({said})")
    except DataError as exc:
        print(f"error: {missing_data(exc, command, values.get('root'))}", file=sys.stderr)
        return 2
    return 0


def missing_data(exc: Exception, command: str, root: object) -> str:
    """A DataError's line, with the command that fetches missing data where there is network."""
    from unbiased.data import DataMissing

    if not isinstance(exc, DataMissing):
        return str(exc)
    if exc.fetched_to is not None:
        return (f"{exc}; or on a machine with internet (the login node): {command} puts them "
                f"in {exc.fetched_to}, where the sweep reads them if its machine shares that "
                f"directory")
    return (f"{exc}: fetch it on a machine with internet (the login node): {command}, then run "
            f"the sweep with --root {root}")


def sweep_missing_data(exc: Exception, args) -> str:
    """`missing_data` with a sweep's fetch command (a re-run's has none: the benchmark's)."""
    root = args.values.get("root")
    command = args.fetch_command or " ".join(
        [f"python -m sweeps {args.benchmark} --preset {quote(args.preset)} --fetch-data",
         *([f"--root {quote(str(root))}"] if root else [])])
    return missing_data(exc, command, root)
