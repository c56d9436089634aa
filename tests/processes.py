"""The processes a test started, read from /proc (Linux): Ray's trial workers start sessions of
their own, so neither a process group nor `ray stop` finds them all; their parents do."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from pathlib import Path


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM a server's process group (it was started in a session of its own), SIGKILL
    it after `grace_s`."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


# Below Ray's default ports (GCS 6379, workers 10002-19999), the port blocks Slurm jobs' Ray
# nodes claim (20000-32599, slurm/ray_node.py) and Linux's ephemeral range (32768-60999 by
# default): a port the kernel hands out with bind(0) is also handed to the next outgoing
# connection of any process (Ray's and gRPC's make hundreds), which may hold it by the time the
# server a test starts binds it.
_LISTEN_PORTS = (2000, 6000)
_RANDOM = random.SystemRandom()  # not the random module's: a test may seed that one


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LISTEN_PORTS[1]


def free_port() -> int:
    """A TCP port that nothing listens on now, on every address, outside the kernel's range
    for outgoing connections: for a server a test starts."""
    low, high = _LISTEN_PORTS[0], min(_LISTEN_PORTS[1], _ephemeral_low())
    for _ in range(200):
        port = _RANDOM.randrange(low, high) if high > low else 0
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError(f"no free TCP port in {low}-{high - 1} after 200 tries")


def descendants(pid: int) -> dict[int, str]:
    """pid -> start time (field 22 of /proc/PID/stat) of every live process under `pid`."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            started[int(entry.name)] = fields[19]
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = started[child]
            todo.append(child)
    return found


def alive(pid: int, start: str) -> bool:
    """Whether `pid` is still the process that started at `start` (not a reused pid)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start


def with_text(text: str) -> dict[int, str]:
    """pid -> start time of every live process whose command line holds `text` (a Ray
    session's directory names every process of that Ray, wherever it was reparented)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text not in (entry / "cmdline").read_text(errors="replace"):
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(entry.name)] = fields[19]
    return found


def ray_temp_dir() -> Path:
    """Ray's default temp dir (/tmp/ray), where sessions live: ray._common.utils
    .get_default_ray_temp_dir (private), read without starting Ray."""
    from ray._common.utils import get_default_ray_temp_dir

    return Path(get_default_ray_temp_dir())


def driver_sessions(ray_temp: Path, pid: int) -> list[Path]:
    """The session directories of the Ray a driver started: a head node names its session
    session_<start time>_<pid of the process that started it> (ray._private.node.Node)."""
    return sorted(ray_temp.glob(f"session_*_{pid}"))
