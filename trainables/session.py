"""What a trial needs from whoever runs it: `TrialSession`.

`run_trial` (trainables/common.py) talks to a session, not to Tune: it reports each epoch's
metrics with a checkpoint, asks for the checkpoint to continue from, and asks where it runs.
A checkpoint is one state per member of the trial (a plain trial has one member, ""; a
trial bundle one per grid point), made files by `checkpoint_files` in the trial (so its
`ckpt_s` counts the writing) and read back by `read_checkpoint`: every session stores the
same bytes. `TuneSession` is the adapter a Tune function trainable uses; `RecordingSession`
keeps the reports and the last checkpoint's bytes in memory (tests drive the loop with it,
without Ray). A trial knows its own id and can read another trial's last checkpoint of the
same sweep (a warm start from a baseline trained before it).
"""

from __future__ import annotations

import io
import os
import socket
from typing import Protocol

import torch

from trainables.record import TRIALS_DIR, Records, trial_key_of

# A plain trial's checkpoint file (every sweep before bundles wrote this name); a bundle
# member's is state_<member>.pt.
CHECKPOINT_FILE = "state.pt"


class TrialSession(Protocol):
    def restore(self) -> dict[str, bytes] | None:
        """The files of the last checkpoint (None: a fresh start)."""

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        """One report (an epoch, or a trial's end), with a checkpoint's files."""

    def where(self) -> dict[str, str]:
        """The node and machine columns of every epoch."""

    def gpu_ids(self) -> list:
        """The GPUs the runner gave this trial (empty: none)."""

    def trial_id(self) -> str:
        """This trial's id (Tune's, or the recording session's)."""

    def checkpoint_of(self, key: str) -> dict[str, bytes] | None:
        """The files of the last checkpoint of the sweep's trial `key` (its record's name,
        trainables/record.py; None: it has none)."""


def checkpoint_name(member: str) -> str:
    return CHECKPOINT_FILE if member == "" else f"state_{member}.pt"


def checkpoint_files(states: dict[str, dict]) -> dict[str, bytes]:
    """The files of a checkpoint: torch.save of each member's state."""
    files = {}
    for member, state in states.items():
        buffer = io.BytesIO()
        torch.save(state, buffer)
        files[checkpoint_name(member)] = buffer.getvalue()
    return files


def read_checkpoint(files: dict[str, bytes]) -> dict[str, dict]:
    """The states of a checkpoint's files, by member. On the CPU: RNG states must stay CPU
    byte tensors (map_location=cuda moved them onto the GPU, and every restore on a GPU
    crashed); load_state_dict copies weights and optimiser states onto the trial's device."""
    states = {}
    for name, data in files.items():
        if name == CHECKPOINT_FILE:
            member = ""
        elif name.startswith("state_") and name.endswith(".pt"):
            member = name[len("state_"):-len(".pt")]
        else:
            continue
        states[member] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return states


def machine_id() -> str:
    """Which machine ran an epoch, across sessions and Ray restarts (hostnames repeat: every
    development machine here is `vm`): /etc/machine-id's first 12 characters, else the
    hostname. Per-epoch numbers differ across machines (docs/MEASURED.md), so comparisons
    are made within one."""
    try:
        with open("/etc/machine-id") as f:
            return f.read().strip()[:12] or socket.gethostname()
    except OSError:
        return socket.gethostname()


class TuneSession:
    """The session of a Ray Tune function trainable. The trial's rows and checkpoints go to
    its record in the sweep's storage (trainables/record.py), which every launch and every
    restart reads; Tune gets each report without a checkpoint (its scheduler, progress,
    trackers and searchers read the metrics). `config`: the trial's config as Tune gave it."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.records: Records | None = None
        self.rows: list[dict] = []
        self.restored: dict[str, bytes] | None = None

    def _record(self) -> Records:
        """The sweep's records, and this trial's own read once: its rows and checkpoint."""
        if self.records is None:
            from ray import tune

            storage = tune.get_context().get_storage()
            self.records = Records(storage.storage_filesystem,
                                   f"{storage.experiment_fs_path}/{TRIALS_DIR}")
            self.key = trial_key_of(self.config) or self.trial_id()
            record = self.records.read(self.key)
            if record is not None and record.checkpoint is not None:
                self.rows = record.rows
                self.restored = self.records.checkpoint(record)
            else:
                from trainables.common import trial_config

                self.records.start(self.key, trial_config(self.config))
        return self.records

    def restore(self) -> dict[str, bytes] | None:
        self._record()
        return self.restored

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        from ray import tune

        records = self._record()
        self.rows.append(dict(metrics))
        records.write(self.key, self.rows, checkpoint)
        tune.report(metrics)

    def where(self) -> dict[str, str]:
        # Hostnames repeat across Ray nodes on one machine (and in some clusters); node ids not.
        # Under Slurm (slurm/sweep.sbatch), the node Slurm named: the Ray node started there
        # passes SLURMD_NODENAME on to its workers.
        import ray

        return {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(), "machine": machine_id()}

    def gpu_ids(self) -> list:
        import ray

        try:
            return list(ray.get_gpu_ids()) if ray.is_initialized() else []
        except Exception:  # noqa: BLE001 - outside a worker Ray may refuse; then there are none
            return []

    def trial_id(self) -> str:
        from ray import tune

        return tune.get_context().get_trial_id()

    def checkpoint_of(self, key: str) -> dict[str, bytes] | None:
        records = self._record()
        record = records.read(key)
        return None if record is None else records.checkpoint(record)


class RecordingSession:
    """Reports kept in memory with the last checkpoint's files: a test drives run_trial with
    it, restarts from `checkpoint` (a new session given the old one's), and reads `reports`."""

    def __init__(self, checkpoint: dict[str, bytes] | None = None,
                 gpus: list | None = None, trial_id: str = "recorded",
                 others: dict[str, dict[str, bytes]] | None = None) -> None:
        self.checkpoint = checkpoint
        self.reports: list[dict] = []
        self.checkpoints = 0  # reports that came with a checkpoint
        self.gpus = gpus or []
        self.id = trial_id
        self.others = others or {}  # other trials' last checkpoints, by trial id

    def restore(self) -> dict[str, bytes] | None:
        return None if self.checkpoint is None else dict(self.checkpoint)

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint is not None:
            self.checkpoint = dict(checkpoint)
            self.checkpoints += 1

    def where(self) -> dict[str, str]:
        return {"node": socket.gethostname(), "node_id": "local", "machine": machine_id()}

    def gpu_ids(self) -> list:
        return list(self.gpus)

    def trial_id(self) -> str:
        return self.id

    def checkpoint_of(self, trial_id: str) -> dict[str, bytes] | None:
        files = self.others.get(trial_id)
        return None if files is None else dict(files)
