"""slurm/ray_node.py's port blocks: outside Ray's default ranges, claimed per process so that
two jobs starting together on a node never share one, a dead job's claim taken over."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

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


@pytest.fixture
def short_tmp():
    path = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.ray
@pytest.mark.system
def test_a_block_taken_after_the_check_is_retried_with_another(short_tmp):
    """Another process binds the claimed block's GCS port between ray_node's check and `ray
    start`'s bind: `ray start` fails, and ray_node starts Ray on another block."""
    tmp_path = short_tmp  # Ray's sockets live under it: 107 characters at most
    claims = tmp_path / "ray_port_blocks"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_ADDRESS"))}
    env.update(RAY_USAGE_STATS_ENABLED="0", SLURM_JOB_ID="77")
    node = subprocess.Popen([sys.executable, str(ROOT / "slurm" / "ray_node.py"), "head",
                             str(tmp_path / "ray")], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    taken = socket.socket()
    try:
        deadline = time.monotonic() + 30
        while not (claims.exists() and any(claims.iterdir())):
            assert time.monotonic() < deadline and node.poll() is None, "no block claimed"
            time.sleep(0.005)
        first = int(next(claims.iterdir()).name)
        taken.bind(("", first))  # the GCS port of the block just claimed
        taken.listen(1)
        address = tmp_path / f"ray_{os.uname().nodename}" / "address"
        deadline = time.monotonic() + 120
        while not address.exists():
            assert time.monotonic() < deadline and node.poll() is None, "Ray did not start"
            time.sleep(0.2)
        port = int(address.read_text().rsplit(":", 1)[1])
        assert port != first and port % ray_node.BLOCK == 0
        assert sorted(p.name for p in claims.iterdir()) == [str(port)]  # the first released
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGUSR2)  # as the batch script stops it
        out = node.communicate(timeout=60)[0]
        taken.close()
        print(out)
    assert f"failed on ports {first}-{first + ray_node.BLOCK - 1}" in out, out
    assert "trying another block" in out and f"ports {port}-" in out, out
    assert node.returncode == 0 and not list(claims.iterdir()), out


OTHER_USER = ("nobody", "nogroup")
AS_OTHER_USER = pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                                   reason="runs a claim as another user: needs root and setpriv")


@pytest.fixture
def shared_tmp():
    """A directory every user writes to, sticky, as /tmp on a shared node."""
    path = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _claim_as_other_user(parent: Path, job: str) -> subprocess.CompletedProcess:
    """ray_node.py's claim as OTHER_USER, from a copy every user reads (the checkout may be
    private, as CI's clone is); skips where that user cannot run this Python at all."""
    code_dir = Path(tempfile.mkdtemp(prefix="rncode", dir="/tmp"))
    code_dir.chmod(0o755)
    script = code_dir / "ray_node.py"
    shutil.copy(ROOT / "slurm" / "ray_node.py", script)
    script.chmod(0o644)
    code = (f"import importlib.util, pathlib; s = importlib.util.spec_from_file_location("
            f"'n', {str(script)!r}); n = importlib.util.module_from_"
            f"spec(s); s.loader.exec_module(n); c = n.claims_dir(pathlib.Path({str(parent)!r}))"
            f"; print(c.name, n.port_block({job!r}, '0', c))")
    user, group = OTHER_USER
    as_user = ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups"]
    try:
        if subprocess.run([*as_user, sys.executable, "-c", "import json, socket"],
                          capture_output=True, timeout=60, cwd="/").returncode != 0:
            pytest.skip(f"user {user} cannot run this Python ({sys.executable})")
        return subprocess.run([*as_user, sys.executable, "-c", code], capture_output=True,
                              text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(code_dir, ignore_errors=True)


@AS_OTHER_USER
def test_another_users_job_on_the_node_claims_beside_roots_claims(shared_tmp):
    # A root job ran on the node first: the claims directory is root's, and so are its claims.
    claims = ray_node.claims_dir(shared_tmp)
    assert claims.name == "ray_port_blocks" and claims.stat().st_mode & 0o7777 == 0o1777
    mine = ray_node.port_block("51", "0", claims)  # held: this process is alive
    other = _claim_as_other_user(shared_tmp, "51")
    assert other.returncode == 0 and not other.stderr, other.stderr
    name, theirs = other.stdout.split()
    assert name == "ray_port_blocks" and int(theirs) != mine
    # Root's job died without releasing: its claim is not the other user's to remove, so
    # the other user takes another block; its own dead claim it takes over.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (claims / str(mine)).write_text(dead)
    again = _claim_as_other_user(shared_tmp, "51")
    assert again.returncode == 0 and not again.stderr, again.stderr
    assert again.stdout.split() == ["ray_port_blocks", theirs]
    assert (claims / str(mine)).read_text() == dead


@AS_OTHER_USER
def test_a_claims_directory_another_user_cannot_write_gives_way_to_ones_own(shared_tmp):
    (shared_tmp / "ray_port_blocks").mkdir(mode=0o755)  # an older run's, root's alone
    other = _claim_as_other_user(shared_tmp, "52")
    assert other.returncode == 0 and not other.stderr, other.stderr
    assert other.stdout.split()[0] == f"ray_port_blocks.{65534}"


def _resources(monkeypatch, env: dict[str, str], affinity: int = 64
               ) -> tuple[list[str], dict[str, str]]:
    for key in ("SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU",
                "SLURM_MEM_PER_GPU", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(ray_node.os, "sched_getaffinity", lambda pid: set(range(affinity)))
    flags, ray_env = ray_node.slurm_resources("n1")
    return flags, ray_env


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def test_rays_cpus_are_the_steps_affinity_mask_when_it_holds_fewer_than_slurm_says(
        monkeypatch, capsys):
    flags, _ = _resources(monkeypatch, {"SLURM_CPUS_ON_NODE": "8"}, affinity=2)
    assert _flag(flags, "--num-cpus") == "2"
    assert ("n1: warning: Slurm gave the job 8 CPUs here, this step may run on 2 (its "
            "affinity mask): Ray counts 2") in capsys.readouterr().out
    flags, _ = _resources(monkeypatch, {"SLURM_CPUS_ON_NODE": "8"}, affinity=8)
    assert _flag(flags, "--num-cpus") == "8" and "warning" not in capsys.readouterr().out


@pytest.mark.parametrize(("env", "job_mb"), [
    ({"SLURM_MEM_PER_NODE": "64000"}, 64000),
    ({"SLURM_MEM_PER_CPU": "4000", "SLURM_CPUS_ON_NODE": "8"}, 32000),
    ({"SLURM_MEM_PER_GPU": "16000", "CUDA_VISIBLE_DEVICES": "0,1"}, 32000),
    ({}, None),
])
def test_rays_object_store_and_memory_follow_the_jobs_memory_not_the_nodes(monkeypatch, env,
                                                                           job_mb):
    flags, ray_env = _resources(monkeypatch, {"SLURM_CPUS_ON_NODE": "8", **env})
    assert ray_env["RAY_prestart_worker_first_driver"] == "0"  # no idle workers
    if job_mb is None:  # no memory asked: Ray's own defaults
        assert "--memory" not in flags and "--object-store-memory" not in flags
        return
    mib = 1024 ** 2
    store, memory = int(_flag(flags, "--object-store-memory")), int(_flag(flags, "--memory"))
    assert store == job_mb * 3 // 10 * mib and store + memory == job_mb * mib


def test_the_heads_address_is_one_other_nodes_reach_or_the_one_given(monkeypatch):
    monkeypatch.delenv("SWEEP_HEAD_IP", raising=False)
    # A peer that resolves to this host's loopback (as 127.0.1.1 on Debian): not an address
    # another machine reaches; the default route's interface (or the hostname's) instead.
    ip = ray_node.node_ip("n1", ["n1", "localhost"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            routed = s.getsockname()[0]
        except OSError:
            routed = None
    if routed is not None and not routed.startswith("127."):
        assert ip == routed
    monkeypatch.setenv("SWEEP_HEAD_IP", "10.1.2.3")
    assert ray_node.node_ip("n1", ["n2"]) == "10.1.2.3"
