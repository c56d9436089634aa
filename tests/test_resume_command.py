"""The command a stopped sweep prints to continue it."""

from __future__ import annotations

import shlex

import pytest

from sweeps.cli import build_parser, resolve
from sweeps.signals import resume_command
from unbiased.benchmarks import benchmark_spec

# Each test runs a sweep driver or a Ray: the integration tier.
pytestmark = pytest.mark.ray


@pytest.mark.parametrize("argv, expected", [
    (["sweeps/x.py", "--preset", "cpu"], ["sweeps/x.py", "--preset", "cpu", "--resume"]),
    (["sweeps/x.py", "--done", "a.csv", "--out", "o"], ["sweeps/x.py", "--out", "o", "--resume"]),
    (["sweeps/x.py", "--done=a.csv", "--overwrite"], ["sweeps/x.py", "--resume"]),
    (["x.py", "--resume", "--out", "my dir"], ["x.py", "--resume", "--out", "my dir"]),
])
def test_the_resume_command_drops_what_a_resume_refuses(argv, expected):
    assert shlex.split(resume_command(argv)) == expected


def test_the_resume_command_of_a_done_run_parses(tmp_path):
    done = tmp_path / "rows.csv"
    done.write_text("method,sigma,lam,K,seed,epoch\n")
    argv = ["sweeps/digits_grid.py", "--preset", "cpu", "--done", str(done), "--overwrite",
            "--out", str(tmp_path / "out")]
    args = shlex.split(resume_command(argv))[1:]
    spec = benchmark_spec("digits")
    parser = build_parser("digits_grid.py", "d", spec.presets, benchmark=spec)
    resolved = resolve(parser, "digits", spec.presets, args)
    assert resolved.resume and resolved.done is None and not resolved.overwrite
