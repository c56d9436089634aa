"""The sweep drivers (`python -m sweeps NAME`). Every command here reads the benchmark
registry first: one that cannot be read is one `error:` line, exit 2."""

from unbiased.benchmarks import exit_on_bad_registry

exit_on_bad_registry()
