"""Start or join the Ray a sweep runs on."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from sweeps import ray_private
from sweeps.common import SweepError


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a host:port nobody listens on (ray.init would retry for minutes)."""
    target = address.split("://", 1)[-1]
    if address == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise SweepError(f"cannot connect to Ray at --address {address}: "
                         f"{exc.strerror or exc}") from None


def init_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        check_reachable(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        else:
            init_local_ray()
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SweepError(f"cannot connect to Ray at --address {address}: {first}") from None


def init_local_ray() -> None:
    """A fresh local Ray (never one of RAY_ADDRESS or a `ray start`) whose processes run in
    sessions of their own, so a SIGTERM to the driver's group reaches the driver alone
    (docs/DESIGN.md; PR_SET_PDEATHSIG still ends them with it)."""
    import ray

    ray_private.no_prestarted_workers()
    with ray_private.ray_processes_in_own_sessions():
        ray.init(address="local", include_dashboard=False)


# The nodes the batch script starts Ray on, waited for before a trial's ask is compared.
EXPECT_NODES_ENV = "SWEEP_EXPECT_NODES"  # the job's node names, comma-separated (or a count)
NODES_WAIT_ENV = "SWEEP_NODES_WAIT_S"
NODES_WAIT_S = 120.0  # `ray start` on a worker: seconds; a node that takes longer is lost


def expected_nodes() -> list[str]:
    """The nodes the batch script started Ray on: their names, or a count of empty names."""
    value = os.environ.get(EXPECT_NODES_ENV, "").strip()
    if value.isdigit():
        return [""] * int(value)
    return [n for n in value.split(",") if n]
# On a `ray up` cluster's head: the node types its autoscaler may add (Tune's own test).
AUTOSCALER_CONFIG = Path("~/ray_bootstrap_config.yaml")


@dataclass(frozen=True)
class NodeShape:
    name: str
    cpus: float
    gpus: float
    may_add: bool = False  # a node type the autoscaler may start, not a node

    def describe(self) -> str:
        what = "node type" if self.may_add else ""
        return f"{what} {self.name} has {_count(self.cpus, 'CPU')} and " \
               f"{_count(self.gpus, 'GPU')}".strip()


def _count(n: float, unit: str) -> str:
    return f"{n:g} {unit}{'' if n == 1 else 's'}"


def _node_name(node: dict) -> str:
    for key in node.get("Resources", {}):
        if key.startswith("slurm_node:"):
            return key.split(":", 1)[1]
    return str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress"))


def cluster_nodes(expect: int = 0, timeout_s: float = NODES_WAIT_S) -> list[NodeShape]:
    """The live nodes once `expect` are up (or after `timeout_s`), and the node types an
    autoscaler may add."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= expect or time.monotonic() > deadline:
            break
        time.sleep(1)
    shapes = [NodeShape(_node_name(n), float(n["Resources"].get("CPU", 0)),
                        float(n["Resources"].get("GPU", 0))) for n in alive]
    return sorted(shapes, key=lambda s: s.name) + autoscaler_node_types()


def check_all_joined(address: str | None, expect: list[str], nodes: list[NodeShape],
                     wait_s: float) -> None:
    """Refuse a run where fewer nodes joined than the batch script started Ray on."""
    joined = [n for n in nodes if not n.may_add]
    if len(joined) >= len(expect):
        return
    names = {n.name for n in joined}
    missing = [n for n in expect if n and n not in names]
    who = ", ".join(missing) if missing else f"{len(expect) - len(joined)} of them"
    raise SweepError(
        f"{len(joined)} of the job's {len(expect)} nodes joined the Ray at {address} within "
        f"{wait_s:g} s ({NODES_WAIT_ENV} waits longer): {who} did not. Their `ray start` was given "
        f"{address}: a node that cannot reach it (a firewall, another network: set "
        f"SWEEP_HEAD_IP to the head's address on the job's network) or whose Ray cannot "
        f"start (its lines above)")


def autoscaler_node_types(path: Path = AUTOSCALER_CONFIG) -> list[NodeShape]:
    path = path.expanduser()
    if not path.is_file():
        return []
    import yaml

    try:
        types = (yaml.safe_load(path.read_text()) or {}).get("available_node_types") or {}
    except (OSError, yaml.YAMLError):
        return []
    return [NodeShape(name, float(t.get("resources", {}).get("CPU", 0)),
                      float(t.get("resources", {}).get("GPU", 0)), may_add=True)
            for name, t in types.items() if int(t.get("max_workers", 0)) > 0]


def check_resources(address: str | None, cpus: float, gpus: float,
                    nodes: list[NodeShape] | None = None) -> list[NodeShape]:
    """Refuse a sweep whose trials ask more than any node has: Ray would wait for such a node
    forever (nothing autoscales under Slurm)."""
    if nodes is None:
        expect = expected_nodes()
        wait_s = float(os.environ.get(NODES_WAIT_ENV) or NODES_WAIT_S)
        nodes = cluster_nodes(len(expect), wait_s)
        check_all_joined(address, expect, nodes, wait_s)
    if address:
        print(f"Ray at {address}: " + ", ".join(n.describe() for n in nodes), flush=True)
    if any(n.cpus >= cpus and n.gpus >= gpus for n in nodes):
        return nodes
    ask = (f"each trial asks {_count(cpus, 'CPU')} and {_count(gpus, 'GPU')} "
           f"(--cpus-per-trial {cpus:g} --gpus-per-trial {gpus:g})")
    where = f"the Ray at {address}" if address else "this machine's Ray"
    fixes = []
    if gpus > 0 and not any(n.gpus >= gpus for n in nodes):
        if os.environ.get("SLURM_JOB_ID"):
            fixes.append("give the job GPUs (sbatch --gres=gpu:N or --gpus-per-node=N, with "
                         "--cpus-per-task=C) or run on CPUs (--gpus-per-trial 0 --device cpu)")
        else:
            fixes.append("join a cluster with GPU nodes, or run on CPUs (--gpus-per-trial 0 "
                         "--device cpu)")
    if not any(n.cpus >= cpus for n in nodes):
        fixes.append("ask fewer CPUs (--cpus-per-trial)"
                     + (" or give the job more (sbatch --cpus-per-task=C)"
                        if os.environ.get("SLURM_JOB_ID") else ""))
    raise SweepError(f"{ask}, and no node of {where} has that many: "
                     + ", ".join(n.describe() for n in nodes) + "; " + "; ".join(fixes))
