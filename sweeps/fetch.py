"""`--fetch-data`: a sweep's data fetched (or checked) on a machine with network, such as a
cluster's login node, for sweeps on nodes without it; and the line a sweep ends on where its
data is missing and cannot be downloaded, naming that command.

    python -m sweeps digits --preset paper --fetch-data --root DATA    # on the login node
    sbatch ... slurm/sweep.sbatch sweeps/digits_grid.py --preset paper --root DATA

Every benchmark says what its data is through its spec's `fetch` (unbiased/benchmarks/spec.py);
this module names none. The command (sweeps/cli.py: `fetch_command`) is the sweep's own
driver, preset and --root, so the fetch reads exactly the settings the sweep does.
"""

from __future__ import annotations

import sys


def run_fetch(benchmark: str, preset: str, values: dict, command: str) -> int:
    """Fetch (or check) what a sweep of `values` reads, printing what is there; the exit
    status: 0, or 2 after one `error:` line (data the program cannot download, or no network
    here). Starts no Ray and writes no OUT."""
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
    """A DataError's line for the user: where the data is missing and could not be
    downloaded here (unbiased.data.DataMissing), with the command that fetches it on a
    machine with network; any other DataError as it is."""
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
    """`missing_data` for a sweep's SweepArgs (sweeps/cli.py): its fetch command, or, for
    SweepArgs made without one (a re-run), the benchmark's with the sweep's preset."""
    from shlex import quote

    root = args.values.get("root")
    command = args.fetch_command or " ".join(
        [f"python -m sweeps {args.benchmark} --preset {quote(args.preset)} --fetch-data",
         *([f"--root {quote(str(root))}"] if root else [])])
    return missing_data(exc, command, root)
