"""A trial's record: its reported rows and its last checkpoint, in a layout of ours.

    <storage>/<experiment>/trials/<key>/
        point.json          the trial's key and flat config, written before its first report
        epochs.jsonl        every report so far, one JSON object a line, rewritten whole
        checkpoint/<n>/     the files of the n-th report's checkpoint (state.pt, state_m<i>.pt)
        end.json            the trial ended (its last epoch, a stop of its own, or the
                            scheduler's): no launch runs it again

A report writes its checkpoint's files, then the rows naming it, then deletes the others: a
kill at any point leaves a whole checkpoint to go on from (docs/DESIGN.md). Local files are
renamed into place; an object store's PUT shows a file whole or not at all.
"""

from __future__ import annotations

import json
import socket
import uuid
from dataclasses import dataclass, field

from pyarrow import fs as pafs

from unbiased.settings import MEMBERS_KEY, POINT_KEY, SETTINGS_KEY, WARM_FROM, flat_config

TRIALS_DIR = "trials"
POINT_FILE = "point.json"
END_FILE = "end.json"  # the driver saw the trial end (or --done took it over)
ROWS_FILE = "epochs.jsonl"
CHECKPOINT_DIR = "checkpoint"
_CHECKPOINT = "_checkpoint"  # in a row: {"dir": "<n>", "files": [...]} of its checkpoint
RESTORED = "restored"  # in a report to Tune: a row of the record, told again after a restart


def trial_key(points: list[dict]) -> str:
    """A trial's name in its sweep, the same in every launch: its grid point's values
    (`sigma=0.03_method=mi_backprop_lam=1.0_seed=0_K=40`: W&B refuses commas); a bundle's,
    its first member's with the number of the others."""
    first = "_".join(f"{k}={v}" for k, v in points[0].items()
                     if k not in (WARM_FROM, SETTINGS_KEY) and v is not None)
    return first if len(points) == 1 else f"{first}+{len(points) - 1}"


def trial_key_of(config: dict) -> str | None:
    point = config.get(POINT_KEY)
    if not point:
        return None
    return trial_key(point.get(MEMBERS_KEY, [point]))


@dataclass
class Record:
    key: str
    config: dict
    rows: list[dict] = field(default_factory=list)  # up to the newest whole checkpoint
    checkpoint: str | None = None  # that checkpoint's directory
    # end.json's status. Rows that reach the last epoch without it (written while a stop
    # came) run again, so that the trackers get every epoch.
    ended: str | None = None

    def metrics(self) -> list[dict]:
        return [reported(row) for row in self.rows]


def reported(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != _CHECKPOINT}


def records_root(storage: str, experiment: str) -> str:
    return storage.rstrip("/") + "/" + experiment + "/" + TRIALS_DIR


class RecordStore:
    def __init__(self, filesystem: pafs.FileSystem | None, root: str) -> None:
        self._fs, self._root = filesystem, root.rstrip("/")

    @classmethod
    def at(cls, storage: str, experiment: str) -> RecordStore:
        """A bucket is reached at the first read or write, not before: a dry run never does."""
        return cls.located(records_root(storage, experiment))

    @classmethod
    def located(cls, root: str) -> RecordStore:
        return cls(None if "://" in root else pafs.LocalFileSystem(), root)

    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs, self._root = pafs.FileSystem.from_uri(self._root)
        return self._fs

    @property
    def root(self) -> str:
        """The records' directory in `fs` (a URI's path)."""
        return self._root if self.fs is not None else ""

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def _dir(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _write(self, path: str, data: bytes) -> None:
        parent = path.rpartition("/")[0]
        self.fs.create_dir(parent, recursive=True)
        target = f"{path}.{uuid.uuid4().hex[:8]}.tmp" if self.local else path
        with self.fs.open_output_stream(target) as out:
            out.write(data)
        if self.local:
            self.fs.move(target, path)

    def _read(self, path: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(path) as stream:
                return stream.read()
        except (FileNotFoundError, OSError):
            return None

    def _listing(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(path, recursive=recursive,
                                                       allow_not_found=True))

    def start(self, key: str, config: dict) -> None:
        for name in (ROWS_FILE, END_FILE):
            if self._exists(f"{self._dir(key)}/{name}"):
                self.fs.delete_file(f"{self._dir(key)}/{name}")
        self._write(f"{self._dir(key)}/{POINT_FILE}",
                    json.dumps({"key": key, "config": config},
                               default=_json_value).encode())

    def write(self, key: str, rows: list[dict], files: dict[str, bytes] | None) -> None:
        """The rows so far; with `files`, the last row's checkpoint, written before them and
        named in that row."""
        if files is not None:
            keep = f"{len(rows):06d}"
            for name, data in files.items():
                self._write(f"{self._dir(key)}/{CHECKPOINT_DIR}/{keep}/{name}", data)
            rows[-1][_CHECKPOINT] = {"dir": keep, "files": sorted(files)}
        else:  # the rows name the checkpoint an earlier row named
            keep = next((row[_CHECKPOINT]["dir"] for row in reversed(rows)
                         if _CHECKPOINT in row), None)
        lines = "".join(json.dumps(row, default=_json_value) + "\n" for row in rows)
        self._write(f"{self._dir(key)}/{ROWS_FILE}", lines.encode())
        for info in self._listing(f"{self._dir(key)}/{CHECKPOINT_DIR}"):
            if info.type == pafs.FileType.Directory and info.base_name != keep:
                self.fs.delete_dir(info.path)

    def end(self, key: str, status: str) -> None:
        self._write(f"{self._dir(key)}/{END_FILE}", json.dumps({"status": status}).encode())

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def read(self, key: str) -> Record | None:
        """The trial's record (None: it never started), its rows up to the newest whole
        checkpoint (and the rows after it when none of them names one: a diverged last
        report carries none)."""
        point = self._read(f"{self._dir(key)}/{POINT_FILE}")
        if point is None:
            return None
        config = json.loads(point)["config"]
        end = self._read(f"{self._dir(key)}/{END_FILE}")
        ended = None if end is None else json.loads(end)["status"]
        rows = _rows(self._read(f"{self._dir(key)}/{ROWS_FILE}") or b"")
        present = {info.path.rpartition(f"/{CHECKPOINT_DIR}/")[2]
                   for info in self._listing(f"{self._dir(key)}/{CHECKPOINT_DIR}", recursive=True)
                   if info.type == pafs.FileType.File}
        for i in range(len(rows) - 1, -1, -1):
            named = rows[i].get(_CHECKPOINT)
            if named is None:
                continue
            if all(f"{named['dir']}/{name}" in present for name in named["files"]):
                cut = any(_CHECKPOINT in row for row in rows[i + 1:])
                return Record(key, config, rows[:i + 1] if cut else rows, named["dir"], ended)
        if any(_CHECKPOINT in row for row in rows):
            return Record(key, config, [], None)  # no named checkpoint is whole: start again
        return Record(key, config, rows, None, ended)

    def checkpoint(self, record: Record) -> dict[str, bytes] | None:
        if record.checkpoint is None:
            return None
        files = {}
        for info in self._listing(f"{self._dir(record.key)}/{CHECKPOINT_DIR}/"
                                  f"{record.checkpoint}"):
            if info.type == pafs.FileType.File and not info.base_name.endswith(".tmp"):
                files[info.base_name] = self._read(info.path)
        return files

    def begin(self) -> None:
        """The directory `--resume` looks for, made before any trial reports (a sweep
        stopped before its first report resumes too)."""
        self.fs.create_dir(self.root, recursive=True)

    def exist(self) -> bool:
        return self._exists(self.root)

    def keys(self) -> list[str]:
        return sorted(info.base_name for info in self._listing(self.root)
                      if info.type == pafs.FileType.Directory)

    def read_all(self) -> dict[str, Record]:
        records = {key: self.read(key) for key in self.keys()}
        return {key: record for key, record in records.items() if record is not None}

    def clear(self) -> None:
        if self._exists(self.root):
            self.fs.delete_dir(self.root)


class StoreSession:
    """A trial's session (unbiased/trial.py) that keeps its rows and checkpoints in its
    record, so a restart in any process continues from it; `trial_id` names a trial without
    a grid point."""

    def __init__(self, records: RecordStore, config: dict, trial_id: str = "") -> None:
        self.records = records
        self.config = config
        self.key = trial_key_of(config) or trial_id
        self.rows: list[dict] = []
        self.restored: dict[str, bytes] | None = None
        record = records.read(self.key)
        flat = flat_config(config)
        # A bundle's key names its first member and their number: the same key with other
        # members (another piece's bundling) is another trial.
        if (record is not None and record.checkpoint is not None
                and plain(record.config.get(MEMBERS_KEY)) == plain(flat.get(MEMBERS_KEY))):
            self.rows = record.rows
            self.restored = records.checkpoint(record)
        else:
            records.start(self.key, flat)

    def restore(self) -> dict[str, bytes] | None:
        return self.restored

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        self.rows.append(dict(metrics))
        self.records.write(self.key, self.rows, checkpoint)

    def where(self) -> dict[str, str]:
        from unbiased.trial import machine_id

        return {"node": socket.gethostname(), "node_id": "local", "machine": machine_id()}

    def gpu_ids(self) -> list:
        return []

    def checkpoint_of(self, key: str) -> dict[str, bytes] | None:
        record = self.records.read(key)
        return None if record is None else self.records.checkpoint(record)


def plain(value: object) -> object:
    """`value` as point.json holds it."""
    return json.loads(json.dumps(value, default=_json_value))


def _json_value(value: object) -> object:
    """A numpy or torch scalar as the Python number it holds (never its string)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def _rows(data: bytes) -> list[dict]:
    """The rows of epochs.jsonl up to the first that does not parse (a file cut by hand or
    by a disk: the epochs after it are run again)."""
    rows = []
    for line in data.decode(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows
