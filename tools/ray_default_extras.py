"""Install what `ray[default]` adds to this environment into a directory of its own.

`ray job submit` needs a head whose dashboard runs its job server, i.e. `ray[default]`. Installed
in the environment itself, its packages would change every Ray the test suite starts: Ray
starts the full dashboard agent, with its metric exporters, wherever they import
(`ray._private.utils.get_dashboard_dependency_error`). So they go to TARGET, and only the
processes that should see them (the job test's cluster) get TARGET on their PYTHONPATH.

Only the packages the environment lacks are installed, at the versions a resolver picks with
the environment's own versions held fixed: nothing in TARGET shadows a package the environment
already has. Usage: python tools/ray_default_extras.py TARGET
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pip_sources import uv_flags  # noqa: E402


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing(pinned: list[str], installed: set[str]) -> list[str]:
    """`name==version` lines of a resolver's output whose name is not installed."""
    lines = [line.split(";")[0].strip() for line in pinned]
    return [line for line in lines if line and not line.startswith(("#", "-"))
            and normalized(re.split(r"[=<>!~\[ ]", line, maxsplit=1)[0]) not in installed]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/ray_default_extras.py TARGET", file=sys.stderr)
        return 2
    target = Path(argv[0])
    requirement = f"ray[default]=={metadata.version('ray')}"
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        # pip cannot hold the environment's versions while resolving into a --target: it
        # installs ray[default] whole there, shadowing the environment's ray with the same one.
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                        str(target), requirement], check=True)
        return 0
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=False).stdout
    sources = uv_flags(listed)
    python = ["--python", sys.executable]
    versions = {normalized(d.metadata["Name"]): d.version for d in metadata.distributions()}
    held = [f"{name}=={version}" for name, version in sorted(versions.items())]
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch, "constraints.txt")
        constraints.write_text("\n".join(held) + "\n")
        compiled = subprocess.run(
            [str(uv), "pip", "compile", "--quiet", *python, "--index-strategy",
             "unsafe-best-match", *sources, "--no-header", "--no-annotate", "-c",
             str(constraints), "-"], input=requirement + "\n", capture_output=True,
            text=True, check=True).stdout
    extras = missing(compiled.splitlines(), set(versions))
    if not extras:
        print(f"{requirement} adds nothing to this environment")
        target.mkdir(parents=True, exist_ok=True)
        return 0
    subprocess.run([str(uv), "pip", "install", "--quiet", *python, "--index-strategy",
                    "unsafe-best-match", *sources, "--compile-bytecode", "--no-deps",
                    "--target", str(target), *extras], check=True)
    print(f"{requirement}: {len(extras)} packages in {target} ({', '.join(extras)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
