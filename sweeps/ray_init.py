"""Start or join the Ray a sweep runs on."""

from __future__ import annotations

import os
import socket

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
    """Join the Ray at `address`, or (none given) start a local one of this driver's own."""
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
    """A fresh local Ray, never one found through RAY_ADDRESS or a `ray start` on this
    machine (/tmp/ray/ray_current_cluster), whose processes (GCS, raylet, monitors) run in
    sessions of their own: a SIGTERM to the driver's process group (`timeout`,
    `kill -- -PGID`, a scheduler's cancel) then reaches the driver alone, and StopSignals
    saves the state before shutting them down. In the driver's group they died at once and
    the driver hung 60 s on the lost GCS, saving nothing. They still die with the driver:
    Ray sets PR_SET_PDEATHSIG on them."""
    import ray

    ray_private.no_prestarted_workers()
    with ray_private.ray_processes_in_own_sessions():
        ray.init(address="local", include_dashboard=False)
