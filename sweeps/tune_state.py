"""Tune's saved state of a sweep, made fit to resume: whole files put back after a kill, the
trials in the grid's order. The layout these read and rewrite is Tune's own
(sweeps/ray_private.py); only local storage is touched: object stores never show a partly
written file, and their state is read as Tune wrote it."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

from sweeps import ray_private
from sweeps.common import SweepError


def _readable(path: Path) -> bool:
    """Whether a state file loads whole (Tune writes JSON or, whatever the suffix, pickle)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    for load in (json.loads, pickle.loads):
        try:
            load(data)
            return True
        except Exception:
            pass
    return False


def _staged_copies(staging_root: Path, experiment: Path) -> dict[Path, Path]:
    """Relative path -> the newest file of that path in the driver's staging directories of
    `experiment` (one per Ray session that ran it). Every sweep of one driver has the same
    experiment name, so a staging directory counts only if it holds an experiment state
    file of this experiment's (their names carry the second its session started)."""
    own = {p.name for p in experiment.glob(ray_private.EXPERIMENT_STATE)}
    newest: dict[Path, Path] = {}
    for staging in ray_private.staging_dirs(staging_root, experiment.name):
        if not own & {p.name for p in staging.glob(ray_private.EXPERIMENT_STATE)}:
            continue
        for path in staging.rglob("*"):
            rel = path.relative_to(staging)
            if path.is_file() and (rel not in newest
                                   or path.stat().st_mtime > newest[rel].stat().st_mtime):
                newest[rel] = path
    return newest


def repair_cut_off_state(storage: str, ray_temp: Path | None = None) -> list[str]:
    """Put back whole copies of the Tune files a kill cut off; return what was done.

    The driver writes Tune's experiment state and each trial's result.json/progress.csv in a
    staging directory under Ray's temp dir, then copies them into the experiment directory
    in place. A driver killed during that copy leaves cut-off files there: `Tuner.restore`
    cannot read a cut experiment state, and a cut (often empty) result.json loses the epochs
    reported before the kill. The staging file was whole before the copy began, so a stored
    file that is a proper prefix of it (or missing, or an unreadable state file) gets it
    back, atomically. A state file with no whole copy left cannot be resumed from (an older
    session's state may name checkpoints `num_to_keep` has deleted): a SweepError, before Ray.
    """
    if "://" in storage or not Path(storage).is_dir():
        return []
    from analysis.io import atomic_write_bytes

    staging_root = ray_temp or ray_private.ray_temp_dir()
    done = []
    for experiment in sorted(p.parent for p in Path(storage).glob(f"*/{ray_private.TUNER_FILE}")):
        staged = _staged_copies(staging_root, experiment)
        state_files = {p.relative_to(experiment) for pattern in ray_private.STATE_PATTERNS
                       for p in experiment.glob(pattern)}
        put_back = []
        for rel, source in sorted(staged.items()):
            target = experiment / rel
            if not target.parent.is_dir():
                continue  # a trial Tune never stored: it starts afresh
            whole = source.read_bytes()
            stored = target.read_bytes() if target.is_file() else None
            if stored is None or (len(stored) < len(whole) and whole.startswith(stored)) or (
                    rel in state_files and not _readable(target) and _readable(source)):
                atomic_write_bytes(target, whole)
                put_back.append(str(rel))
        if put_back:
            shown = ", ".join(put_back[:3]) + (", ..." if len(put_back) > 3 else "")
            done.append(f"put back Tune's whole staging copies of {len(put_back)} file(s) "
                        f"of {experiment} that the kill cut off or left behind ({shown})")
        for rel in sorted(state_files):
            if not _readable(experiment / rel):
                raise SweepError(
                    f"cannot resume: Tune's saved state {experiment / rel} is cut off (the "
                    f"driver was killed while writing it) and no whole copy is left under "
                    f"{staging_root}; start the sweep again with --overwrite")
    return done


def _local_states(exp_path: str) -> Iterator[tuple[Path, dict, list]]:
    """Each experiment state of a local experiment directory that reads as Tune's JSON:
    (its path, the state, its TRIAL_DATA). Nothing for an object store's (read as Tune wrote
    it) or a state this code does not know (Tune reads it as it is)."""
    if "://" in exp_path:
        return
    for path in sorted(Path(exp_path).glob(ray_private.EXPERIMENT_STATE)):
        try:
            state = json.loads(path.read_text())
            trials = state[ray_private.TRIAL_DATA]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(trials, list):
            yield path, state, trials


def _checkpointed_rows(text: str) -> dict[str, dict]:
    """A trial's result.json (its text): checkpoint directory name -> the row that came with
    it (the last, where a resumed trial reported one twice)."""
    rows: dict[str, dict] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short: not the one a checkpoint was registered with
        if isinstance(row, dict) and row.get("checkpoint_dir_name"):
            rows[row["checkpoint_dir_name"]] = row
    return rows


def name_checkpoints_on_disk(exp_path: str) -> list[str]:
    """Point each trial whose saved state names a deleted checkpoint at its newest one in
    storage; return what was done. Tune registers a trial's new checkpoint, deletes the one
    before (`num_to_keep=1`) and saves its experiment state only after that: a kill in
    between leaves a state naming the deleted checkpoint, and Tune's restore then fails the
    trial ("Could not recover from checkpoint as it does not exist on storage anymore")
    each time it is retried. The newest checkpoint with a result.json row (one Tune
    registered) is named with that row, as Tune would have saved it; a trial without one is
    left as it is. Local directories and object stores alike, through pyarrow's filesystem of
    `exp_path` (as Tune reads them); a state is rewritten whole (atomically on disk, one PUT
    in a bucket)."""
    from fnmatch import fnmatch

    from pyarrow import fs as pafs

    from analysis.io import atomic_write_text

    storage, root = pafs.FileSystem.from_uri(exp_path) if "://" in exp_path else (
        pafs.LocalFileSystem(), str(Path(exp_path).resolve()))

    def read(path: str) -> str | None:
        try:
            with storage.open_input_stream(path) as stream:
                return stream.read().decode()
        except (OSError, UnicodeDecodeError):
            return None

    def listed(path: str) -> list:
        try:
            return storage.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except OSError:
            return []

    done: list[str] = []
    states = sorted(i.path for i in listed(root) if i.type == pafs.FileType.File
                    and fnmatch(i.base_name, ray_private.EXPERIMENT_STATE))
    for path in states:
        try:
            state = json.loads(read(path) or "")
            trials = state[ray_private.TRIAL_DATA]
        except (ValueError, KeyError, TypeError):
            continue  # not a state this code knows: Tune reads it as it is
        changed = False
        for entry in trials:
            named = ray_private.saved_checkpoint_path(entry)
            if named is None or storage.get_file_info(named).type != pafs.FileType.NotFound:
                continue
            trial_dir, name = named.rstrip("/").rsplit("/", 1)
            later = sorted((i.base_name for i in listed(trial_dir)
                            if i.type == pafs.FileType.Directory
                            and fnmatch(i.base_name, "checkpoint_*") and i.base_name > name),
                           reverse=True)
            # The newest Tune registered: a kill can also cut a trial's upload of its next
            # checkpoint from the report that would have registered it (no row yet).
            rows = _checkpointed_rows(read(f"{trial_dir}/result.json") or "")
            found = next(((c, rows[c]) for c in later if c in rows), None)
            if found is None:
                continue
            ray_private.name_saved_checkpoint(entry, f"{trial_dir}/{found[0]}", found[1])
            changed = True
            done.append(f"{trial_dir.rsplit('/', 1)[-1]}: {name}, deleted, -> {found[0]}")
        if not changed:
            continue
        if isinstance(storage, pafs.LocalFileSystem):
            atomic_write_text(Path(path), json.dumps(state))
        else:
            with storage.open_output_stream(path) as stream:
                stream.write(json.dumps(state).encode())
    return done


def saved_state(exp_path: str) -> bool:
    """Whether Tune saved an experiment state to restore from (a driver killed in its first
    seconds leaves only tuner.pkl: there is nothing to resume, the sweep starts afresh)."""
    from ray import tune

    return tune.Tuner.can_restore(exp_path) and (
        "://" in exp_path or any(Path(exp_path).glob(ray_private.EXPERIMENT_STATE)))


def order_saved_trials(exp_path: str) -> bool:
    """Put the trials of Tune's saved experiment state back in the grid's order; True if
    that changed a file. Tune saves them in a dict's order and, on restore, asks for actors
    for the waiting trials in that order (beside what the scheduler picks), so a resumed grid
    ran trials of seed 2 before those of seed 0. The JSON stays as Tune wrote it but for the
    order of its trials."""
    from analysis.io import atomic_write_text
    from sweeps.scheduling import grid_position

    changed = False
    for path, state, trials in _local_states(exp_path):
        try:
            keyed = [(grid_position(ray_private.saved_trial_id(t)), t) for t in trials]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue  # not a state this code knows: Tune reads it as it is
        ordered = [t for _, t in sorted(keyed, key=lambda item: item[0])]
        if ordered != trials:
            state[ray_private.TRIAL_DATA] = ordered
            atomic_write_text(path, json.dumps(state))
            changed = True
    return changed


def order_restored_grid(tuner) -> None:
    """A sweep saved before GridOrderScheduler existed restores Tune's plain FIFO (the
    scheduler is pickled with the run). Tuner.restore takes no scheduler, so put the grid's
    order in place of a default FIFO here; any other scheduler is left as saved."""
    from ray.tune.schedulers import FIFOScheduler

    from sweeps.scheduling import GridOrderScheduler

    config = ray_private.restored_tune_config(tuner)
    if config is not None and (config.scheduler is None or type(config.scheduler) is FIFOScheduler):
        config.scheduler = GridOrderScheduler()
