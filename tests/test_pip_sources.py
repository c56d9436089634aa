"""tools/pip_sources.py: pip's configured sources handed to uv by the Makefile's install; and
tools/ray_default_extras.py, which installs ray[default] beside the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.pip_sources import uv_flags

ROOT = Path(__file__).resolve().parents[1]


def test_each_source_comes_from_its_highest_precedence_scope():
    listed = "\n".join([
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        "global.find-links='/opt/global-wheels'",
        ":env:.find-links='/opt/wheels'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "user.index-url='https://mirror.example/simple'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
    ])
    assert uv_flags(listed) == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt"]


def test_no_configuration_is_no_flag():
    assert uv_flags("") == []
    assert uv_flags("global.timeout='60'") == []


def test_the_command_prints_one_line_of_pips_own_configuration():
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=True).stdout
    printed = subprocess.run([sys.executable, str(ROOT / "tools" / "pip_sources.py")],
                             capture_output=True, text=True, check=True).stdout
    assert printed.count("\n") == 1
    assert printed.split() == uv_flags(listed)


def test_ray_defaults_extras_are_only_what_the_environment_lacks():
    """tools/ray_default_extras.py installs, from a resolver's pinned output, the packages not
    installed (names compared as pip normalises them): nothing that would shadow the
    environment's own."""
    from tools.ray_default_extras import missing

    pinned = ["aiohttp-cors==0.8.1", "grpcio==1.85.3 ; python_version >= '3.9'",
              "Google_API.core==2.44.0", "ray==2.58.1", "protobuf==6.33.0", "# via ray", ""]
    assert missing(pinned, {"ray", "protobuf", "google-api-core"}) == [
        "aiohttp-cors==0.8.1", "grpcio==1.85.3"]
