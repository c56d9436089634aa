"""What `ray up cluster.yaml` puts on a node, and whether the README's cluster commands run
there as written: rsync with the very flags Ray's command runner builds from the YAML
(rsync_filter_args below) copies this checkout into a temporary home, as the
file mount `~/unbiased-mi: .` does, and each sweep command the README gives for the cluster
runs in it with `--dry-run`. rsync is what `ray up` ships files with: without it these tests
fail, saying so (make test installs it: tools/system_packages.sh)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MOUNT = "unbiased-mi"  # cluster.yaml: file_mounts ~/unbiased-mi: .


@pytest.fixture(scope="module")
def node_home(tmp_path_factory) -> Path:
    """A node's home after `ray up`: the checkout rsync'd to ~/unbiased-mi."""
    rsync = shutil.which("rsync")
    assert rsync, ("rsync is not installed: `ray up` ships the repository with it "
                   "(apt install rsync; make test installs it where it can)")
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    assert cluster["file_mounts"] == {f"~/{MOUNT}": "."}
    home = tmp_path_factory.mktemp("node")
    # Ray runs `rsync -avz FLAGS ./ node:~/unbiased-mi` (a directory's source ends in "/").
    copied = subprocess.run([rsync, "-az", *rsync_filter_args(cluster), "./",
                             f"{home / MOUNT}/"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert copied.returncode == 0, copied.stderr
    return home


def test_every_tracked_file_reaches_a_node_and_no_local_state_does(node_home):
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split("\0")
    tracked = {p for p in tracked if p and (ROOT / p).is_file()}
    node = node_home / MOUNT
    arrived = {str(p.relative_to(node)) for p in node.rglob("*") if p.is_file()}
    missing = sorted(tracked - arrived)
    assert not missing, f"{len(missing)} tracked files not shipped: {missing[:10]}"
    local = sorted(p for p in arrived
                   if p.split("/")[0] in (".git", ".venv", "results", "data")
                   or "__pycache__" in p.split("/"))
    assert not local, local[:10]
    assert "unbiased/benchmarks/german/shipped/german.data" in arrived  # package data
    assert any(p.startswith("bench/results/") for p in arrived)


def _readme_cluster_commands() -> list[str]:
    """The sweep commands the README runs on a cluster's head: the line inside `ray exec`,
    and the top list's line marked for a cluster."""
    text = (ROOT / "README.md").read_text()
    inside = re.findall(r"ray exec cluster\.yaml --tmux \\\n\s*'([^']+)'", text)
    top = [line.split("#", 1)[0].strip() for line in text.splitlines()
           if "--address auto" in line and "cluster" in line.split("#", 1)[-1]
           and not line.lstrip().startswith(("'", "ray "))]
    return inside + [f"cd ~/{MOUNT} && {line}" for line in top]


def test_the_readmes_cluster_commands_run_on_what_reaches_the_head(node_home):
    commands = _readme_cluster_commands()
    assert len(commands) >= 2, commands
    # The head's python is the image's (no .venv there): this test's stands in for it.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VIRTUAL_ENV")}
    env.update(HOME=str(node_home), PATH=f"{Path(sys.executable).parent}{os.pathsep}"
                                         f"{env.get('PATH', '')}")
    # The storage URI cluster.yaml gives every container (its placeholder bucket: a dry run
    # does not ask the storage).
    cluster = (ROOT / "cluster.yaml").read_text()
    env["UNBIASED_STORAGE_PATH"] = re.search(r"--env UNBIASED_STORAGE_PATH=(\S+)",
                                             cluster).group(1)
    for command in commands:
        assert ".venv" not in command and "--root data" not in command, command
        ran = subprocess.run(["bash", "-c", f"{command} --dry-run"], env=env,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, (command, ran.stdout[-1500:] + ran.stderr[-1500:])
        assert "trials" in ran.stdout, (command, ran.stdout[-1500:])
        assert shlex.split(command)[-1] == "auto"  # it joins the cluster's Ray


def rsync_filter_args(cluster: dict) -> list[str]:
    """The rsync flags `ray up` uses for the file mounts of the cluster YAML `cluster`: the
    autoscaler's command runner turns rsync_exclude and rsync_filter into them
    (SSHCommandRunner._create_rsync_filter_args, private; no state of the runner read) and
    runs `rsync -avz FLAGS SRC/ NODE:DST` for each file mount."""
    from ray.autoscaler._private.command_runner import SSHCommandRunner

    options = {"rsync_exclude": cluster.get("rsync_exclude"),
               "rsync_filter": cluster.get("rsync_filter")}
    return SSHCommandRunner._create_rsync_filter_args(None, options)
