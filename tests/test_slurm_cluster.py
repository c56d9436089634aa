"""The test Slurm's own start (tests/slurm_cluster.py): its ports are ones no outgoing
connection is handed, and a port another process binds between its choice and the daemon's
bind makes the start choose again instead of failing a test file's every test."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from tests import processes, slurm_cluster

pytestmark = [pytest.mark.system]


def test_a_free_port_is_bindable_and_outside_the_outgoing_connections_range():
    low = processes._ephemeral_low()
    for _ in range(50):
        port = processes.free_port()
        assert processes._LISTEN_PORTS[0] <= port < low, port
        with socket.socket() as s:
            s.bind(("", port))  # on every address, as slurmctld binds it


def test_a_port_taken_before_slurmctld_binds_it_makes_the_start_choose_again(monkeypatch,
                                                                                 capfd):
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        chosen: Iterator[int] = iter([taken])  # slurmctld's port on the first try

        def port() -> int:
            return next(chosen, None) or processes.free_port()

        monkeypatch.setattr(slurm_cluster, "free_port", port)
        try:
            with slurm_cluster.slurm_cluster() as cluster:
                conf = (cluster.home / "slurm.conf").read_text()
                ctld_port = int(re.search(r"SlurmctldPort=(\d+)", conf).group(1))
                nodes = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").split()
        except slurm_cluster.SlurmUnavailable as exc:
            pytest.fail(f"Slurm cannot be started here: {exc}", pytrace=False)
    assert ctld_port != taken
    assert sorted(nodes) == sorted([*slurm_cluster.NODES, "idle", "idle"])
    assert "a port was taken before a daemon bound it (try 1 of 3)" in capfd.readouterr().err
