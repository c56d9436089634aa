"""One Ray node of a Slurm job, started by slurm/sweep.sbatch through `srun` on each node.

`python slurm/ray_node.py head TEMP` or `... worker TEMP HEAD_ADDRESS`: `ray start --block`
with the CPUs, GPUs and memory Slurm gave the job on this node, every port Ray opens taken
from one block of free ports, and a temporary directory of its own (TEMP_<node name>): two
jobs that Slurm places on one node then share no port and no directory (two Rays on one
host collide on the defaults, ray-project/ray#10154). The head writes HOST:PORT to
TEMP_<node>/address once its GCS answers. On SIGUSR2 (srun passes on the batch script's) or SIGTERM
`ray start` stops the processes it started, and the directory is removed. Standard library
only: it runs before anything is imported from the project.
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

# Ports 11000-31999: above Ray's and most services' defaults, below Linux's ephemeral range
# (32768-60999), where an outgoing connection could hold a port between the check and Ray's
# bind. 200 ports a block: the fixed ones, then the workers' range (a worker process each).
FIRST_PORT, LAST_PORT, BLOCK = 11000, 32000, 200
SLOTS = (LAST_PORT - FIRST_PORT) // BLOCK
FIXED = ("port", "ray-client-server-port", "dashboard-port", "node-manager-port",
         "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
         "runtime-env-agent-port", "metrics-export-port")
WORKER_PORTS = 10  # the workers' range starts at the block's 10th port
STARTED = "Ray runtime started."


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def port_block(job: str, restart: str) -> int:
    """The first port of a block nothing on this node listens on. The search starts at a
    slot drawn from the job's id and run, so jobs started together on a node try different
    blocks, and a requeued run does not wait for its last run's ports to be released."""
    start = random.Random(f"{job}.{restart}").randrange(SLOTS)
    for i in range(SLOTS):
        first = FIRST_PORT + ((start + i) % SLOTS) * BLOCK
        if all(port_free(p) for p in range(first, first + BLOCK)):
            return first
    raise SystemExit(f"error: no block of {BLOCK} free ports in {FIRST_PORT}-{LAST_PORT} "
                     f"on {socket.gethostname()}")


def node_ip() -> str:
    """The address other nodes reach this one at: the interface of the default route (no
    packet is sent), else what the hostname resolves to."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def slurm_resources() -> list[str]:
    """`ray start` flags for what Slurm gave this job on this node: its CPUs, the GPUs in
    CUDA_VISIBLE_DEVICES (Slurm sets it for a job given GPUs; none else, so that Ray never
    counts another job's GPUs) and, under --mem, an object store of 30% of that memory (Ray's
    default share, of the node's memory, would overrun the job's limit)."""
    flags = ["--num-cpus", os.environ.get("SLURM_CPUS_ON_NODE", "1")]
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    flags += ["--num-gpus", str(len(gpus))]
    mem_mb = os.environ.get("SLURM_MEM_PER_NODE")
    if not mem_mb and os.environ.get("SLURM_MEM_PER_CPU"):
        mem_mb = str(int(os.environ["SLURM_MEM_PER_CPU"])
                     * int(os.environ.get("SLURM_CPUS_ON_NODE", "1")))
    if mem_mb:
        flags += ["--object-store-memory", str(max(100, int(mem_mb) * 3 // 10) * 1024 ** 2)]
    return flags


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("head", "worker") or (argv[0] == "worker") != (
            len(argv) == 3):
        print("error: usage: ray_node.py head TEMP | ray_node.py worker TEMP HEAD_ADDRESS",
              file=sys.stderr)
        return 2
    role, name = argv[0], os.environ.get("SLURMD_NODENAME", socket.gethostname())
    temp = Path(f"{argv[1]}_{name}")
    temp.mkdir(parents=True, exist_ok=True)
    first = port_block(os.environ.get("SLURM_JOB_ID", "0"),
                       os.environ.get("SLURM_RESTART_COUNT", "0"))
    ports = dict(zip(FIXED, range(first, first + len(FIXED)), strict=False))
    if role == "worker":  # the head's own ports only on the head
        for key in ("port", "ray-client-server-port", "dashboard-port"):
            del ports[key]
    elif importlib.util.find_spec("grpc") is None:
        # Ray starts its client server (default port 10001) only where `ray[client]` is
        # installed, and refuses a port for it where it is not.
        del ports["ray-client-server-port"]
    ip = node_ip() if role == "head" else ""
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--block",
           "--temp-dir", str(temp), "--disable-usage-stats",
           "--min-worker-port", str(first + WORKER_PORTS),
           "--max-worker-port", str(first + BLOCK - 1),
           "--resources", json.dumps({f"slurm_node:{name}": 1}),
           *[f"--{key}={value}" for key, value in ports.items()], *slurm_resources()]
    cmd += (["--head", "--node-ip-address", ip, "--include-dashboard", "false"]
            if role == "head" else ["--address", argv[2]])
    log = temp / "ray_start.log"
    # Slurm signals every process of the step, Ray's too: they ignore USR2 (inherited through
    # exec), so that `ray start` stops them on the SIGTERM sent below, not dies of it at once.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)
        if proc.poll() is None:
            proc.terminate()  # `ray start --block` drains and stops its node's processes

    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):  # USR2: the batch script's
        signal.signal(sig, stop)
    try:
        while proc.poll() is None and STARTED not in log.read_text(errors="replace"):
            time.sleep(0.5)
        if proc.poll() is None:
            address = f"{ip}:{ports['port']}" if role == "head" else ""
            print(f"ray_node: {role} on {name}, ports {first}-{first + BLOCK - 1}"
                  + (f", address {address}" if address else ""), flush=True)
            if role == "head":
                (temp / "address.part").write_text(address)
                (temp / "address.part").rename(temp / "address")
        code = proc.wait()
        if stopping:
            return 0
        print(f"ray_node: `ray start` on {name} ended by itself ({code}):\n"
              + log.read_text(errors="replace")[-3000:], file=sys.stderr, flush=True)
        return 1
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever of this node's Ray is left (workers that outlived their raylet)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
