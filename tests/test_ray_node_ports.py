"""slurm/ray_node.py's port blocks: outside Ray's default ranges, claimed per process so that
two jobs starting together on a node never share one, a dead job's claim taken over."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ray_node", ROOT / "slurm" / "ray_node.py")
assert spec is not None and spec.loader is not None
ray_node = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ray_node)

RAY_WORKER_PORTS = range(10002, 20000)  # `ray start`'s default --min/--max-worker-port
EPHEMERAL = range(32768, 61000)  # Linux's default ip_local_port_range


def test_blocks_lie_outside_rays_defaults_and_the_ephemeral_range():
    first, last = ray_node.FIRST_PORT, ray_node.LAST_PORT - 1
    for taken in (RAY_WORKER_PORTS, EPHEMERAL, range(6379, 6380), range(8265, 8266),
                  range(10001, 10002)):
        assert last < taken.start or first >= taken.stop, taken
    assert (ray_node.LAST_PORT - ray_node.FIRST_PORT) % ray_node.BLOCK == 0


def test_two_claims_for_the_same_job_and_second_take_different_blocks(tmp_path):
    a = ray_node.port_block("41", "0", tmp_path)
    b = ray_node.port_block("41", "0", tmp_path)  # the same slot drawn first: already claimed
    assert a != b and abs(a - b) >= ray_node.BLOCK
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([str(a), str(b)])
    ray_node.release(tmp_path, a)
    assert ray_node.port_block("41", "0", tmp_path) == a  # released: free again
    ray_node.release(tmp_path, a)
    ray_node.release(tmp_path, b)
    assert not list(tmp_path.iterdir())


def test_a_dead_processs_claim_is_taken_over_a_live_ones_is_not(tmp_path):
    first = ray_node.port_block("42", "0", tmp_path)
    ray_node.release(tmp_path, first)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / str(first)).write_text(dead)
    assert ray_node.port_block("42", "0", tmp_path) == first
    (tmp_path / str(first)).write_text("1")  # init: alive
    assert ray_node.port_block("42", "0", tmp_path) != first


def test_a_block_with_a_port_in_use_is_skipped(tmp_path):
    first = ray_node.port_block("43", "0", tmp_path)
    ray_node.release(tmp_path, first)
    with socket.socket() as s:
        s.bind(("", first + 57))  # any port of the block
        assert ray_node.port_block("43", "0", tmp_path) != first
