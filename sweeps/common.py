"""What the sweep core, its runner and the trackers share, in one place every one of them
imports (and that imports none of them): the user-facing error, how a driver ends on it, and a
trial's flat config."""

from __future__ import annotations

import sys

POINT_KEY = "point"  # sweeps/core.py puts each trial's grid point under this config key


class SweepError(Exception):
    """A sweep cannot start or finish; the message is one line for the user."""


def fail(message: str) -> None:
    """A driver's end on a SweepError: its one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def flat_config(config: dict) -> dict:
    """A trial's config with its grid point's keys at the top level."""
    return {**{k: v for k, v in config.items() if k != POINT_KEY},
            **(config.get(POINT_KEY) or {})}
