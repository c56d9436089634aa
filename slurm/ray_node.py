"""One Ray node of a Slurm job, started by slurm/sweep.sbatch through `srun` on each node.

`python slurm/ray_node.py head TEMP` or `... worker TEMP HEAD_ADDRESS`: `ray start --block`
with the CPUs, GPUs and memory Slurm gave the job on this node, every port Ray opens taken
from one block of free ports claimed for this job, and a temporary directory of its own
(TEMP_<node name>): two jobs that Slurm places on one node then share no port and no
directory (two Rays on one host collide on the defaults, ray-project/ray#10154). The head
writes HOST:PORT to TEMP_<node>/address once its GCS answers. On SIGUSR2 (srun passes on the
batch script's) or SIGTERM `ray start` stops the processes it started, and the directory is
removed. `python slurm/ray_node.py check-gpus`: exit 2, with one line, where torch does not
see the GPUs Slurm gave this node. Standard library only: it runs before anything is
imported from the project.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Ports 20000-32599: above Ray's defaults (GCS 6379, client 10001, dashboard 8265, workers
# 10002-19999, which another user's Ray on a shared node may hold without listening yet) and
# below Linux's ephemeral range (32768-60999), where an outgoing connection could take a port
# between the check and Ray's bind. 200 ports a block: the fixed ones, then the workers' range.
FIRST_PORT, LAST_PORT, BLOCK = 20000, 32600, 200
SLOTS = (LAST_PORT - FIRST_PORT) // BLOCK
FIXED = ("port", "ray-client-server-port", "dashboard-port", "node-manager-port",
         "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
         "runtime-env-agent-port", "metrics-export-port")
WORKER_PORTS = 10  # the workers' range starts at the block's 10th port
STARTED = "Ray runtime started."
STOP_WAIT_S = 10.0  # a stop signal to SIGKILL of what is left of this node's Ray
TRIES = 3  # blocks tried when `ray start` fails (a port taken between the check and its bind)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claims_dir(parent: Path) -> Path:
    """Where this node's jobs claim port blocks: one directory every user's jobs share,
    sticky and world-writable as /tmp is, so a claim is removed only by its owner and another
    user's claim reads as taken. Where that directory is not writable to this user (made
    before by another user's older run), one of this user's own: the bind check and the
    retries then keep its jobs apart from the others'."""
    shared = parent / "ray_port_blocks"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if shared.stat().st_uid == os.getuid():
            os.chmod(shared, 0o1777)  # mkdir's mode is cut by the umask
    except OSError:
        pass
    if os.access(shared, os.W_OK | os.X_OK):
        return shared
    own = parent / f"ray_port_blocks.{os.getuid()}"
    own.mkdir(mode=0o700, parents=True, exist_ok=True)
    return own


def claim(claims: Path, first: int) -> bool:
    """Take block `first` for this process: a file created exclusively, holding its pid. A
    claim whose process has ended is taken over (another user's: taken, as the sticky
    directory keeps it). Jobs starting in the same second on one node then never share a
    block, whatever their ports looked like when checked."""
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / str(first)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(path.read_text() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and _pid_alive(owner):
                return False
            try:
                if not owner and time.time() - path.stat().st_mtime < 5:
                    return False  # being written this instant
                path.unlink(missing_ok=True)
            except PermissionError:
                return False  # another user's, in the sticky directory: theirs to remove
            continue
        except PermissionError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def port_block(job: str, restart: str, claims: Path, skip: frozenset[int] = frozenset()
               ) -> int:
    """The first port of a block nothing on this node listens on, claimed for this process
    (release it with `release`). The search starts at a slot drawn from the job's id and run,
    so that jobs started together on a node try different blocks first, and a requeued run
    does not wait for its last run's ports to be released."""
    start = random.Random(f"{job}.{restart}").randrange(SLOTS)
    for i in range(SLOTS):
        first = FIRST_PORT + ((start + i) % SLOTS) * BLOCK
        if first in skip or not all(port_free(p) for p in range(first, first + BLOCK)):
            continue
        if claim(claims, first):
            return first
    raise SystemExit(f"error: no block of {BLOCK} free ports in {FIRST_PORT}-{LAST_PORT - 1} "
                     f"on {socket.gethostname()}")


def release(claims: Path, first: int) -> None:
    path = claims / str(first)
    try:
        if int(path.read_text() or 0) == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


HEAD_IP_ENV = "SWEEP_HEAD_IP"  # the head's address, where the one found is not the right one


def node_ip(name: str, peers: list[str]) -> str:
    """The address the job's other nodes reach this one at: SWEEP_HEAD_IP where set; else the
    interface of the route to another node of the job (no packet is sent), so neither
    127.0.1.1 (what Debian's /etc/hosts gives the hostname) nor the first interface of a
    node with several networks; else the default route's; else what the hostname resolves
    to."""
    override = os.environ.get(HEAD_IP_ENV, "").strip()
    if override:
        return override
    targets = []
    for peer in peers:
        if peer == name:
            continue
        try:
            targets.append(socket.getaddrinfo(peer, None, socket.AF_INET)[0][4][0])
        except (OSError, IndexError):
            continue
    for target in [*targets, "10.255.255.255"]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((target, 1))
            except OSError:
                continue
            ip = s.getsockname()[0]
        if not ip.startswith("127."):
            return ip
    return socket.gethostbyname(socket.gethostname())


def node_cpus(name: str) -> int:
    """The CPUs this node's Ray may use: Slurm's count (SLURM_CPUS_ON_NODE), or fewer where the
    step's affinity mask holds fewer (a step without --cpus-per-task on some releases and
    task/affinity or task/cgroup setups), said in one line: Ray would otherwise start trials
    on CPUs the step cannot run on."""
    given = int(os.environ.get("SLURM_CPUS_ON_NODE", "1"))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else given
    if usable < given:
        print(f"ray_node: {name}: warning: Slurm gave the job {given} CPUs here, this step may "
              f"run on {usable} (its affinity mask): Ray counts {usable}", flush=True)
    return min(given, usable)


def job_memory_mb() -> int | None:
    """The job's memory on this node in MB, as sbatch asked it: --mem, --mem-per-cpu (times
    the node's CPUs) or --mem-per-gpu (times its GPUs); None without any."""
    if os.environ.get("SLURM_MEM_PER_NODE"):
        return int(os.environ["SLURM_MEM_PER_NODE"])
    if os.environ.get("SLURM_MEM_PER_CPU"):
        return int(os.environ["SLURM_MEM_PER_CPU"]) * int(os.environ.get("SLURM_CPUS_ON_NODE",
                                                                            "1"))
    if os.environ.get("SLURM_MEM_PER_GPU") and given_gpus():
        return int(os.environ["SLURM_MEM_PER_GPU"]) * len(given_gpus())
    return None


def slurm_resources(name: str = "") -> tuple[list[str], dict[str, str]]:
    """`ray start` flags and environment for what Slurm gave this job on this node: its CPUs
    (`node_cpus`), the GPUs in CUDA_VISIBLE_DEVICES (Slurm sets it for a job given GPUs; none
    else, so that Ray never counts another job's GPUs), and under a memory request an object
    store of 30% of it (Ray's default share, of the node's memory, would overrun the job's
    limit) and the rest as Ray's memory resource. No idle workers are prestarted: each would
    hold memory the trials need. Ray's memory monitor is left as it is: it reads the node's
    use (every user's) or the cgroup at /sys/fs/cgroup's root, not the job's cgroup, so a
    threshold set from the job's memory would kill trials for others' memory
    (docs/CLUSTER.md, "Memory")."""
    flags = ["--num-cpus", str(node_cpus(name)), "--num-gpus", str(len(given_gpus()))]
    # The raylet prestarts a worker per CPU when the first driver joins, unless told not to.
    env = {"RAY_prestart_worker_first_driver": "0"}
    mem_mb = job_memory_mb()
    if mem_mb:
        store = max(100, mem_mb * 3 // 10)
        flags += ["--object-store-memory", str(store * 1024 ** 2),
                  "--memory", str(max(100, mem_mb - store) * 1024 ** 2)]
    return flags, env


# What torch on this node can do with the GPUs it is given: its version and CUDA build, what
# it counts (NVML: counted even where the CUDA build is newer than the driver), whether CUDA
# itself starts, and a small tensor on every device, as a trial's first step would make one.
TORCH_PROBE = """
import json, torch
counted, available, started, error = torch.cuda.device_count(), False, 0, ""
try:
    available = bool(torch.cuda.is_available())
    for i in range(counted if available else 0):
        float(torch.ones(2, device=f"cuda:{i}").sum())
        started += 1
except Exception as exc:  # noqa: BLE001 - any failure to start CUDA is the answer
    error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda or "none",
                  "counted": counted, "available": available, "started": started,
                  "error": error}))
"""


def given_gpus() -> list[str]:
    """The GPUs Slurm gave this job on this node (CUDA_VISIBLE_DEVICES). `NoDevFiles` (GRES
    configured without device files) is none."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if value.strip() == "NoDevFiles":
        return []
    return [g for g in value.split(",") if g.strip()]


# What Ray's processes write to their logs (TEMP/session_*/logs) when a port they were given
# is taken: the GCS's grpc server, or a bind.
PORT_TAKEN = ("Failed to start the grpc server", "Address already in use")


def port_taken(temp: Path) -> bool:
    for path in temp.glob("session_*/logs/*"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if any(sign in text for sign in PORT_TAKEN):
            return True
    return False


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return "none found (no nvidia-smi on this node)"
    return out[0] if out else "unknown (nvidia-smi printed none)"


def check_gpus(name: str) -> int:
    """Exit 2 with one line where torch cannot use every GPU Slurm gave this node: a CUDA build
    newer than the driver (torch still counts the GPUs, through NVML), a CPU-only build, no
    driver, a device CUDA cannot start. Every trial would fail there."""
    given = given_gpus()
    if not given:
        return 0
    try:
        probe = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True,
                               text=True, timeout=300)
    except subprocess.TimeoutExpired:
        print(f"error: {name}: importing torch and starting CUDA took over 300 s",
              file=sys.stderr, flush=True)
        return 2
    try:
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"error: {name}: {sys.executable} cannot import torch: {last}", file=sys.stderr,
              flush=True)
        return 2
    gpus = f"{len(given)} GPU" + ("" if len(given) == 1 else "s")
    if seen["available"] and seen["started"] >= len(given):
        print(f"ray_node: {name}: torch {seen['version']} started CUDA on the {gpus} Slurm "
              f"gave", flush=True)
        return 0
    build = "a CPU-only build" if seen["cuda"] == "none" else f"a CUDA {seen['cuda']} build"
    if seen["counted"] < len(given):
        what = f"sees {seen['counted']}"
    elif not seen["available"]:
        what = (f"counts {seen['counted']} but cannot start CUDA (torch.cuda.is_available() "
                f"is False)")
    else:
        what = (f"started CUDA on {seen['started']} of them"
                + (f" ({seen['error']})" if seen["error"] else ""))
    print(f"error: {name}: Slurm gave this job {gpus} here, torch {seen['version']} ({build}) "
          f"{what}; NVIDIA driver: {driver_version()}. Install the torch build the driver "
          f"takes (make .venv/.installed TORCH_CUDA=..., docs/CLUSTER.md, \"GPUs, and "
          f"torch's CUDA build\"), or run on CPUs with --device cpu", file=sys.stderr,
          flush=True)
    return 2


def ray_command(role: str, name: str, temp: Path, first: int, head: str | None,
                resources: list[str]) -> tuple[list[str], dict[str, int], str]:
    """`ray start` for this node on the block at `first` with `resources` (`slurm_resources`);
    its ports; the head's IP."""
    ports = dict(zip(FIXED, range(first, first + len(FIXED)), strict=False))
    if role == "worker":  # the head's own ports only on the head
        for key in ("port", "ray-client-server-port", "dashboard-port"):
            del ports[key]
    elif importlib.util.find_spec("grpc") is None:
        # Ray starts its client server (default port 10001) only where `ray[client]` is
        # installed, and refuses a port for it where it is not.
        del ports["ray-client-server-port"]
    peers = [p for p in os.environ.get("SWEEP_JOB_NODES", "").split(",") if p]
    ip = node_ip(name, peers) if role == "head" else ""
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--block",
           "--temp-dir", str(temp), "--disable-usage-stats",
           "--min-worker-port", str(first + WORKER_PORTS),
           "--max-worker-port", str(first + BLOCK - 1),
           "--resources", json.dumps({f"slurm_node:{name}": 1}),
           *[f"--{key}={value}" for key, value in ports.items()], *resources]
    cmd += (["--head", "--node-ip-address", ip, "--include-dashboard", "false"]
            if role == "head" else ["--address", str(head)])
    return cmd, ports, ip


def main(argv: list[str]) -> int:
    name = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    if argv == ["check-gpus"]:
        return check_gpus(name)
    if len(argv) < 2 or argv[0] not in ("head", "worker") or (argv[0] == "worker") != (
            len(argv) == 3):
        print("error: usage: ray_node.py head TEMP | ray_node.py worker TEMP HEAD_ADDRESS | "
              "ray_node.py check-gpus", file=sys.stderr)
        return 2
    role = argv[0]
    temp = Path(f"{argv[1]}_{name}")
    claims = claims_dir(temp.parent)
    log = temp / "ray_start.log"
    # Slurm signals every process of the step, Ray's too: they ignore USR2 (inherited through
    # exec), so that `ray start` stops them on the SIGTERM sent below, not dies of it at once.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    procs: list[subprocess.Popen] = []
    stopping: list[float] = []  # when a stop signal came

    def stop(signum: int, frame: object) -> None:
        stopping.append(time.monotonic())
        if procs and procs[-1].poll() is None:
            procs[-1].terminate()  # `ray start --block` drains and stops its node's processes

    tried: set[int] = set()
    first = 0
    resources, ray_env = slurm_resources(name)
    try:
        for attempt in range(1, TRIES + 1):
            # Empty: a SIGKILLed run's under the same job id and run, or the last attempt's.
            shutil.rmtree(temp, ignore_errors=True)
            temp.mkdir(parents=True)
            first = port_block(os.environ.get("SLURM_JOB_ID", "0"),
                               os.environ.get("SLURM_RESTART_COUNT", "0"), claims,
                               frozenset(tried))
            tried.add(first)
            cmd, ports, ip = ray_command(role, name, temp, first,
                                         argv[2] if role == "worker" else None, resources)
            with open(log, "w") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                              env={**os.environ, **ray_env},
                                              start_new_session=True))
            if attempt == 1:
                for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, stop)  # USR2: the batch script's
            proc = procs[-1]
            while proc.poll() is None and STARTED not in log.read_text(errors="replace"):
                if port_taken(temp):  # `ray start` itself waits 40 s for its GCS to give up
                    os.killpg(proc.pid, signal.SIGKILL)  # it and what it started, at once
                    proc.wait()
                    break
                time.sleep(0.5)
            if proc.poll() is None or stopping:
                break
            release(claims, first)
            if attempt < TRIES:  # most likely a port taken since the check: another block
                print(f"ray_node: `ray start` on {name} failed on ports {first}-"
                      f"{first + BLOCK - 1} ({proc.returncode}); trying another block",
                      flush=True)
                continue
        proc = procs[-1]
        if proc.poll() is None:
            address = f"{ip}:{ports['port']}" if role == "head" else ""
            print(f"ray_node: {role} on {name}, ports {first}-{first + BLOCK - 1}"
                  + (f", address {address}" if address else ""), flush=True)
            if role == "head":
                (temp / "address.part").write_text(address)
                (temp / "address.part").rename(temp / "address")
        while proc.poll() is None and not (stopping and time.monotonic() - stopping[0]
                                            > STOP_WAIT_S):
            time.sleep(0.2)
        if stopping:
            return 0
        code = proc.returncode
        print(f"ray_node: `ray start` on {name} ended by itself ({code}):\n"
              + log.read_text(errors="replace")[-3000:], file=sys.stderr, flush=True)
        return 1
    finally:
        for proc in procs:
            if proc.poll() is None and not stopping:
                proc.terminate()
                try:
                    proc.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
            # Whatever of this node's Ray is left: its processes (the trial workers too) are in
            # `ray start`'s session, and after a plain scancel (Ray's GCS gone with it) they
            # would wait a minute on the GCS, past Slurm's KillWait.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if first:
            release(claims, first)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
