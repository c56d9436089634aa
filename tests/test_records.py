"""A trial's record (trainables/record.py): what a restart reads back after a kill at each
point of a report's write, on a local directory and on S3."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainables.record import RecordStore, trial_key
from unbiased.settings import WARM_FROM

CONFIG = {"epochs": 3, "method": "mi_backprop", "sigma": 0.03, "lam": 1.0, "K": 40, "seed": 0}


def _files(epoch: int) -> dict[str, bytes]:
    return {"state.pt": f"weights after epoch {epoch}".encode()}


def _run(records: RecordStore, key: str, epochs: int) -> list[dict]:
    records.start(key, CONFIG)
    rows = []
    for epoch in range(1, epochs + 1):
        rows.append({"epoch": epoch, "train_acc": 0.5 + epoch / 10, "mi": float("nan")})
        records.write(key, rows, _files(epoch))
    return rows


def test_the_rows_and_the_last_checkpoint_come_back_and_older_checkpoints_go(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    rows = _run(records, "a", 3)
    record = records.read("a")
    assert record.config == CONFIG
    assert [r["epoch"] for r in record.rows] == [1, 2, 3]
    assert record.metrics()[1]["train_acc"] == rows[1]["train_acc"]
    assert np.isnan(record.metrics()[0]["mi"])
    assert records.checkpoint(record) == _files(3)
    assert [p.name for p in (tmp_path / "grid/trials/a/checkpoint").iterdir()] == ["000003"]
    assert records.keys() == ["a"] and set(records.read_all()) == {"a"}
    assert records.read("never started") is None


def test_a_kill_before_the_rows_are_written_continues_from_the_previous_epoch(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    rows = _run(records, "a", 2)
    # epoch 3's checkpoint written, its rows not (the kill came between)
    (tmp_path / "grid/trials/a/checkpoint/000003").mkdir()
    (tmp_path / "grid/trials/a/checkpoint/000003/state.pt").write_bytes(b"epoch 3")
    record = records.read("a")
    assert [r["epoch"] for r in record.rows] == [1, 2]
    assert records.checkpoint(record) == _files(2)
    records.write("a", [*rows, {"epoch": 3}], _files(3))  # the restart's epoch 3
    assert [p.name for p in (tmp_path / "grid/trials/a/checkpoint").iterdir()] == ["000003"]
    assert records.checkpoint(records.read("a")) == _files(3)


def test_a_deleted_checkpoint_falls_back_to_an_older_one_or_to_the_start(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    _run(records, "a", 2)
    older = tmp_path / "grid/trials/a/checkpoint/000001"  # as a kill before the deletes leaves
    older.mkdir()
    (older / "state.pt").write_bytes(_files(1)["state.pt"])
    newest = tmp_path / "grid/trials/a/checkpoint/000002/state.pt"
    newest.unlink()
    record = records.read("a")
    assert [r["epoch"] for r in record.rows] == [1]  # epoch 2 runs again
    assert records.checkpoint(record) == _files(1)
    (older / "state.pt").unlink()
    record = records.read("a")
    assert record.rows == [] and records.checkpoint(record) is None


def test_a_cut_rows_file_keeps_the_whole_lines(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    _run(records, "a", 3)
    path = tmp_path / "grid/trials/a/epochs.jsonl"
    path.write_bytes(path.read_bytes()[:-20])  # the last line cut
    record = records.read("a")
    # epoch 3's row is gone and with it the only checkpoint that is left: from the start
    assert record.rows == [] and records.checkpoint(record) is None
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n")  # epoch 1's row whole, its checkpoint gone
    assert records.read("a").rows == []


def test_a_last_report_without_checkpoint_keeps_its_row(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    rows = _run(records, "a", 2)
    rows.append({"epoch": 3, "diverged": "loss_task is nan"})
    records.write("a", rows, None)
    record = records.read("a")
    assert [r["epoch"] for r in record.rows] == [1, 2, 3]
    assert records.checkpoint(record) == _files(2)
    assert record.ended is None  # rows alone do not end a trial: the driver's end.json does
    records.end("a", "ended")
    assert records.read("a").ended == "ended"


def test_numbers_are_written_as_numbers(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    records.start("a", {**CONFIG, "lam": np.float64(1.0)})
    records.write("a", [{"epoch": np.int64(1), "mi": np.float32(0.25)}], None)
    line = json.loads((tmp_path / "grid/trials/a/epochs.jsonl").read_text())
    assert line == {"epoch": 1, "mi": 0.25}
    assert records.read("a").config["lam"] == 1.0


def test_keys_name_the_grid_point_the_same_way_every_time():
    point = {"sigma": 0.03, "method": "mi_backprop", "lam": 1.0, "seed": 0, "K": 40}
    assert trial_key([point]) == "sigma=0.03_method=mi_backprop_lam=1.0_seed=0_K=40"
    assert trial_key([{**point, WARM_FROM: "sigma=0.03_method=mi_backprop_lam=0.0_seed=0"}]
                     ) == trial_key([point])
    assert trial_key([point, {**point, "lam": 2.0}]).endswith("_K=40+1")


def test_clear_removes_every_record(tmp_path):
    records = RecordStore.at(str(tmp_path), "grid")
    _run(records, "a", 1)
    records.clear()
    assert records.keys() == [] and records.read("a") is None
    records.clear()  # nothing there: nothing to do


@pytest.mark.system
def test_records_in_a_bucket(tmp_path, monkeypatch):
    from tests.s3 import BUCKET, s3_server

    with s3_server(tmp_path) as s3:
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        records = RecordStore.at(f"s3://{BUCKET}/sweep", "grid")
        _run(records, "a", 2)
        record = records.read("a")
        assert [r["epoch"] for r in record.rows] == [1, 2]
        assert records.checkpoint(record) == _files(2)
        assert s3.keys("sweep/grid/trials/a") == [
            "sweep/grid/trials/a/checkpoint/000002/state.pt",
            "sweep/grid/trials/a/epochs.jsonl", "sweep/grid/trials/a/point.json"]


def test_a_bundles_members_keep_their_points_order(tmp_path):
    # A member's key is made from its point as written (the order the grid gave it).
    records = RecordStore.at(str(tmp_path), "grid")
    member = {"sigma": 0.03, "method": "mi_backprop", "lam": 0.5, "seed": 0, "K": 2}
    records.start("b", {"epochs": 3, "members": [member]})
    (read,) = records.read("b").config["members"]
    assert trial_key([read]) == trial_key([member]) == (
        "sigma=0.03_method=mi_backprop_lam=0.5_seed=0_K=2")


@pytest.mark.ray
def test_a_launch_marks_the_records_place_before_any_trial_reports(tmp_path):
    # --resume asks whether a sweep was launched here (sweeps/core.py): the records decide,
    # not Tune's state, and a sweep stopped before its first report counts as launched.
    records = RecordStore.at(str(tmp_path), "grid")
    assert not records.exist()
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "experiment_state-2026-11-28_10-00-00.json").write_text("{}")
    assert not records.exist()
    records.begin()
    assert records.exist() and records.keys() == [] and records.read_all() == {}
    _run(records, "a", 1)
    assert records.exist() and records.keys() == ["a"]
    records.clear()
    assert not records.exist()


def test_a_session_continues_its_own_trial_and_not_a_bundle_of_other_members(tmp_path):
    from trainables.record import StoreSession

    records = RecordStore.at(str(tmp_path), "exp")
    a, b, c = ({"lam": lam, "seed": 0} for lam in (0.5, 1.0, 2.0))
    bundle = {"epochs": 2, "point": {"members": [a, b]}}
    first = StoreSession(records, bundle)
    first.report({"epoch": 1}, {"state.pt": b"one"})
    again = StoreSession(records, bundle)  # a restart of the same trial
    assert again.restore() == {"state.pt": b"one"} and again.rows[0]["epoch"] == 1
    # The same key (first member, one more) with another member: a trial of its own.
    other = StoreSession(records, {"epochs": 2, "point": {"members": [a, c]}})
    assert other.key == first.key and other.restore() is None and other.rows == []
    assert records.read(other.key).config["members"][1] == c
