"""pip's configured package sources as uv flags, for the Makefile's install.

uv reads neither pip.conf nor PIP_* variables. Where pip is set up to find wheels on local
disk (find-links, extra indexes, a constraints file capping torch to the local release), uv
handed nothing would resolve against PyPI alone and could download gigabytes; handed these,
it resolves what pip would. Printed as one line for the shell to split, as pip splits these
settings on whitespace; empty where pip has none.
"""

from __future__ import annotations

import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
# pip's precedence: an environment variable over the site, user and global files.
SCOPES = (":env:", "site", "user", "global")


def uv_flags(config_list: str) -> list[str]:
    """`pip config list` output -> uv flags, each setting from its highest-precedence scope."""
    found: dict[str, dict[str, str]] = {}
    for line in config_list.splitlines():
        key, sep, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if sep and name in FLAGS:
            found.setdefault(name, {})[scope] = value.strip().strip("'\"")
    flags = []
    for name, flag in FLAGS.items():
        by_scope = found.get(name, {})
        value = next((by_scope[s] for s in SCOPES if s in by_scope), None)
        for item in (value or "").split():
            flags += [flag, item]
    return flags


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=False).stdout
    print(" ".join(uv_flags(listed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
