"""IMDB faces without the real data: a synthetic imdb.mat in the release's layout (a Matlab
struct `imdb` written by scipy.io.savemat) plus tiny generated JPEGs exercise the loader
(ages, filters, file checks, splits, bins), the model, a 1-epoch trial under a real local Ray
and the driver end to end."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import ONE_AT_A_TIME
from tests.drivers import Ran, run_sweep
from unbiased.benchmarks.imdb import data as imdb_faces
from unbiased.data import DataError, LoaderSplit

ROOT = Path(__file__).resolve().parents[1]
SIZE = 32  # pixels of the generated JPEGs and of the crops the tests train on
N_CELEBS = 16
# Ages of each celebrity's images: young (EB), middle (test only), old (EB).
AGES = (3, 17, 26, 29, 30, 35, 40, 52, 71, 100)


def datenum(day: dt.date) -> float:
    """Matlab datenum of a date (day 1 = 1 Jan of year 0, a leap year of 366 days)."""
    return float(day.toordinal() + 366)


@dataclass
class FakeImdb:
    root: Path  # holds imdb_crop/
    expected_age: dict[str, int]  # full_path -> age, for rows that must survive
    n_rows: int


def _jpeg(path: Path, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="JPEG")


def write_fake_imdb(base: Path) -> FakeImdb:
    from scipy.io import savemat

    crop = base / "imdb_crop"
    rows: list[dict] = []
    expected: dict[str, int] = {}
    for celeb in range(1, N_CELEBS + 1):
        male = celeb % 2 == 0
        for k, age in enumerate(AGES):
            # Births alternate before and after 1 July: age on 1 July of photo_taken is
            # photo_taken - birth year, minus one for a birthday after 1 July.
            born = dt.date(1950 + celeb, 3 if k % 2 else 9, 15 if k % 3 else 2)
            taken = born.year + age + (1 if (born.month, born.day) > (7, 1) else 0)
            path = f"{celeb:02d}/nm{celeb:07d}_rm{k}_{born.year}_{taken}.jpg"
            rows.append({"dob": datenum(born), "photo_taken": taken, "full_path": path,
                         "gender": float(male), "face_score": 3.0 + k / 10,
                         "second_face_score": math.nan, "celeb_id": celeb})
            expected[path] = age

    def extra(tag: str, **fields) -> None:
        row = {"dob": datenum(dt.date(1970, 1, 1)), "photo_taken": 2000,
               "full_path": f"99/{tag}.jpg", "gender": 0.0, "face_score": 2.0,
               "second_face_score": math.nan, "celeb_id": 1}
        row.update(fields)
        rows.append(row)

    extra("noface", face_score=-math.inf)
    extra("second", second_face_score=3.1)
    extra("nogender", gender=math.nan)
    extra("old", photo_taken=2121)  # 151 years old
    extra("unborn", photo_taken=1960)  # photo taken before birth
    extra("baddob", dob=0.0)  # no valid date
    extra("missing")  # a good row whose JPEG is not on disk
    extra("garbage")  # a good row whose file is not a JPEG
    for i, row in enumerate(rows):
        if row["full_path"] not in ("99/missing.jpg", "99/garbage.jpg"):
            _jpeg(crop / row["full_path"], i)
    (crop / "99" / "garbage.jpg").write_bytes(b"not a jpeg at all")

    n = len(rows)
    col = {k: np.array([r[k] for r in rows], dtype=np.float64)
           for k in ("dob", "photo_taken", "gender", "face_score", "second_face_score",
                     "celeb_id")}
    cells = np.empty(n, dtype=object)
    cells[:] = [r["full_path"] for r in rows]
    names = np.empty(n, dtype=object)
    names[:] = [f"Person {r['celeb_id']}" for r in rows]
    locations = np.empty(n, dtype=object)
    locations[:] = [np.array([[1.0, 1.0, SIZE, SIZE]]) for _ in rows]
    celeb_names = np.empty(N_CELEBS, dtype=object)
    celeb_names[:] = [f"Person {i}" for i in range(1, N_CELEBS + 1)]
    # The release's layout: one 1x1 struct 'imdb' whose fields are 1xN rows (cells for text).
    savemat(str(crop / "imdb.mat"), {"imdb": {
        "dob": col["dob"], "photo_taken": col["photo_taken"], "full_path": cells,
        "gender": col["gender"], "name": names, "face_location": locations,
        "face_score": col["face_score"], "second_face_score": col["second_face_score"],
        "celeb_names": celeb_names, "celeb_id": col["celeb_id"]}})
    return FakeImdb(base, expected, n)


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> FakeImdb:
    return write_fake_imdb(tmp_path_factory.mktemp("imdb"))


@pytest.fixture(scope="module")
def index(fake) -> imdb_faces.ImdbIndex:
    return imdb_faces.load_index(fake.root)


# ----------------------------------------------------------------------------- loader


def test_release_layout_is_what_loadmat_returns(fake):
    from scipy.io import loadmat

    struct = loadmat(str(fake.root / "imdb_crop" / "imdb.mat"))["imdb"][0, 0]
    assert struct["dob"].shape == (1, fake.n_rows)
    assert struct["full_path"][0][0].dtype.kind == "U"  # a char array inside a cell


def test_age_is_whole_years_on_first_of_july_from_the_matlab_datenum():
    # The release's first row: Fred Astaire, born 1899-05-10 (in the file name), photo 1968.
    assert dt.date.fromordinal(693726 - 366) == dt.date(1899, 5, 10)
    dob = np.array([693726.0, datenum(dt.date(1980, 7, 1)), datenum(dt.date(1980, 7, 2)),
                    datenum(dt.date(1980, 12, 31)), 0.0, math.nan])
    taken = np.array([1968.0, 2010, 2010, 2010, 2010, 2010])
    ages = imdb_faces.matlab_age(dob, taken)
    assert ages[:4].tolist() == [69, 30, 29, 29]
    assert np.isnan(ages[4:]).all()


def test_filters_and_file_problems_are_counted(fake, index):
    r = index.report
    assert r.rows == fake.n_rows
    assert (r.no_face, r.second_face, r.no_gender, r.bad_age) == (1, 1, 1, 3)
    assert (r.missing_files, r.unreadable_files) == (1, 1)
    assert r.kept == len(fake.expected_age) == len(index)
    assert r.missing_examples == ["99/missing.jpg"]
    assert r.unreadable_examples == ["99/garbage.jpg"]
    summary = r.summary()
    assert "1 missing files" in summary and "1 unreadable files" in summary
    assert "99/missing.jpg" in summary and "\n" not in summary


def test_ages_and_genders_of_kept_rows(fake, index):
    assert {p: int(a) for p, a in zip(index.path, index.age, strict=True)} == fake.expected_age
    assert index.male.tolist() == [c % 2 == 0 for c in index.celeb_id]
    assert Path(index.root) == fake.root / "imdb_crop"


def test_missing_mat_is_one_line_saying_where_to_get_it(tmp_path):
    for root in (tmp_path, None):
        with pytest.raises(DataError) as err:
            imdb_faces.load_index(root)
        message = str(err.value)
        assert "\n" not in message and imdb_faces.DOWNLOAD_URL in message


def test_not_a_mat_file_is_one_line(tmp_path):
    (tmp_path / "imdb.mat").write_bytes(b"garbage")
    with pytest.raises(DataError, match="cannot read") as err:
        imdb_faces.load_index(tmp_path)
    assert "\n" not in str(err.value)


def test_age_bins_are_five_years_one_hot():
    c = imdb_faces.age_bins(np.array([0, 4, 5, 29, 30, 40, 99, 100]))
    assert c.shape == (8, imdb_faces.C_DIM) == (8, 21)
    assert (c.sum(1) == 1).all()
    assert c.argmax(1).tolist() == [0, 0, 1, 5, 6, 8, 19, 20]


# ----------------------------------------------------------------------------- splits


def test_splits_follow_the_protocol_and_are_disjoint(index):
    splits = imdb_faces.build_splits(index)
    eb1, eb2, test = (splits.rows[k] for k in ("EB1", "EB2", "test"))
    assert len(eb1) and len(eb2) and len(test)
    young, old = index.age <= 29, index.age >= 40
    assert np.all((~index.male[eb1] & young[eb1]) | (index.male[eb1] & old[eb1]))
    assert np.all((index.male[eb2] & young[eb2]) | (~index.male[eb2] & old[eb2]))
    assert not set(eb1) & set(eb2)
    # disjoint by identity, not only by image
    test_people = set(index.celeb_id[test])
    assert not test_people & set(index.celeb_id[np.concatenate([eb1, eb2])])
    # the test set is unrestricted: it keeps the 30-39 year olds and both genders
    assert set(index.age[test]) >= {30, 35} and set(index.male[test]) == {True, False}
    # every non-test image of the right gender x age cell is in its EB split (no cap binds)
    not_test = ~np.isin(index.celeb_id, list(test_people))
    assert len(eb1) == int((not_test & imdb_faces.eb_masks(index)["EB1"]).sum())
    assert splits.pools == {"EB1": len(eb1), "EB2": len(eb2), "test": len(test)}


def test_splits_are_deterministic_and_capped_in_hash_order(index):
    a, b = imdb_faces.build_splits(index), imdb_faces.build_splits(index)
    for name in ("EB1", "EB2", "test"):
        assert a.rows[name].tolist() == b.rows[name].tolist()
    capped = imdb_faces.build_splits(index, {"EB1": 5, "EB2": 4, "test": 3})
    assert [len(capped.rows[k]) for k in ("EB1", "EB2", "test")] == [5, 4, 3]
    assert capped.rows["EB1"].tolist() == a.rows["EB1"][:5].tolist()
    line = imdb_faces.describe_splits(a)
    assert "36,003" in line and "16,799" in line and "22,468" in line


# ----------------------------------------------------------------------------- model, data


def test_benchmark_loads_images_through_workers(index):
    bench = imdb_faces.build(index, "EB2", train_subset=6, max_eval=5, arch="resnet18",
                       weights_path=None, image_size=SIZE, num_workers=2)
    assert set(bench.eval_splits) == {"acc_eb1", "acc_test"}
    assert (bench.c_dim, bench.z_dim, bench.num_classes) == (21, 128, 2)
    assert len(bench.train) == 6 and all(len(s) == 5 for s in bench.eval_splits.values())
    train = bench.train
    assert isinstance(train, LoaderSplit)
    order = torch.tensor([5, 0, 3, 1, 4, 2])
    batches = list(train.batches(4, order))
    assert [len(b[0]) for b in batches] == [4, 2]
    x = torch.cat([b[0] for b in batches])
    assert x.shape == (6, 3, SIZE, SIZE)
    single = LoaderSplit(train.dataset, train.y, train.c, num_workers=0)
    assert torch.equal(x, torch.stack([single.dataset[i] for i in order.tolist()]))
    assert torch.equal(torch.cat([b[1] for b in batches]), train.y[order])
    assert torch.equal(torch.cat([b[2] for b in batches]), train.c[order])
    g = bench.make_features()
    assert g(x[:2]).shape == (2, 128)


def test_weights_are_resolved_or_refused_in_one_line(tmp_path, monkeypatch):
    from unbiased.models import ResNetFeatures, resolve_imagenet_weights

    assert resolve_imagenet_weights("resnet18", "none") is None
    with pytest.raises(DataError, match="not found"):
        resolve_imagenet_weights("resnet18", str(tmp_path / "nope.pth"))
    import torchvision

    net = torchvision.models.resnet18(weights=None)
    path = tmp_path / "r18.pth"
    torch.save(net.state_dict(), path)
    g = ResNetFeatures("resnet18", 128, resolve_imagenet_weights("resnet18", str(path)))
    assert torch.equal(g.backbone.conv1.weight, net.conv1.weight)
    with pytest.raises(DataError, match="does not fit"):
        ResNetFeatures("resnet50", 128, str(path))

    def offline(url, dst, *args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(DataError) as err:
        resolve_imagenet_weights("resnet50", "imagenet")
    message = str(err.value)
    assert "\n" not in message and "--weights PATH" in message and "resnet50-" in message


# ----------------------------------------------------------------------------- Ray


def _trial_config(**overrides) -> dict:
    config = {"train_split": "EB1", "lam": 0.5, "K": 2, "seed": 0, "epochs": 1,
              "batch_size": 8, "lr": 1e-4, "mine_lr": 0.1, "mine_optimizer": "sgd",
              "inner_z": "fresh", "arch": "resnet18", "weights_path": "", "image_size": SIZE,
              "num_workers": 1, "eval_batch_size": 32, "mi_eval_steps": 20, "device": "cpu",
              "num_threads": 1}
    config.update(overrides)
    return config


def test_one_epoch_trial_reports_the_imdb_metrics(index):
    from tests.trials import run_recorded

    result = run_recorded("imdb", _trial_config(), index=index)
    assert result.error is None, result.error
    assert len(result.reports) == 1
    m = result.reports.iloc[-1]
    assert m["epoch"] == 1
    for key in ("train_acc", "acc_eb2", "acc_test", "test_acc"):
        assert 0.0 <= m[key] <= 1.0, key
    assert m["test_acc"] == m["acc_test"]
    assert "acc_eb1" not in m  # trained on EB1: evaluated on EB2 and the test set
    assert math.isfinite(m["mi"]) and math.isfinite(m["mi_eval"])


def _driver(*args: str) -> Ran:
    """The IMDB driver up to where Ray would start, in this process (tests/drivers.py)."""
    return run_sweep("imdb", *args)


@pytest.mark.ray
def test_driver_refuses_a_missing_root_and_bad_flags_in_one_line(tmp_path):
    # A root that does not exist is a flag error: argparse's usage, then one line naming it.
    proc = _driver("--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "--root" in last and "does not exist" in last
    assert not (tmp_path / "out").exists()

    # A root that exists but holds no imdb.mat: one line that says where to get the release.
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _driver("--root", str(empty), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "imdb.mat" in lines[0] and imdb_faces.DOWNLOAD_URL in lines[0]
    assert not (tmp_path / "out").exists()

    from sweeps.cli import build_parser, resolve
    from unbiased.benchmarks import benchmark_spec
    from unbiased.benchmarks.imdb.spec import IMDB

    parser = build_parser("imdb_grid.py", "IMDB", IMDB, benchmark=benchmark_spec("imdb"))
    assert resolve(parser, "imdb", IMDB, ["--train-split", "eb2"])["train_split"] == ["EB2"]
    with pytest.raises(SystemExit) as exit_:
        resolve(parser, "imdb", IMDB, ["--train-split", "EB3"])
    assert exit_.value.code == 2


def test_presets_keep_the_papers_imdb_settings():
    from unbiased.benchmarks.imdb.spec import IMDB

    paper = IMDB["paper"]
    assert (paper["epochs"], paper["batch_size"], paper["lr"]) == (6, 24, 1e-5)
    assert (paper["mine_optimizer"], paper["mine_lr"], paper["K"]) == ("sgd", 0.1, 40)
    assert {0.0, 0.5, 0.9} <= set(paper["lam"]) and paper["seeds"] == [0, 1, 2]
    assert (paper["arch"], paper["weights"], paper["train_subset"]) == ("resnet50", "imagenet",
                                                                        2000)
    assert paper["gpus_per_trial"] == 1.0 and paper["train_split"] == ["EB1", "EB2"]


@pytest.mark.ray
def test_driver_end_to_end_writes_results_and_table_2(ray_local, fake, tmp_path, capsys):
    from sweeps.__main__ import main

    out = tmp_path / "imdb"
    rc = main(["imdb", "--root", str(fake.root), "--arch", "resnet18", "--weights", "none",
               "--image-size", str(SIZE), "--train-subset", "0", "--max-eval", "0",
               "--lam", "0", "--K", "2", "--seeds", "0", "--epochs", "1",
               "--batch-size", "8", "--mi-eval-steps", "20", "--workers", "0",
               "--eval-batch-size", "64", "--device", "cpu", *ONE_AT_A_TIME,
               "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "EB1" in printed and "(paper 36,003" in printed
    df = pd.read_parquet(out / "results.parquet")
    assert (df["benchmark"] == "imdb").all() and len(df) == 2  # 2 splits x 1 epoch
    assert sorted(df["train_split"].unique()) == ["EB1", "EB2"]
    eb1, eb2 = df[df["train_split"] == "EB1"], df[df["train_split"] == "EB2"]
    assert eb1["acc_eb2"].notna().all() and eb1["acc_eb1"].isna().all()
    assert eb2["acc_eb1"].notna().all() and eb2["acc_eb2"].isna().all()
    assert (df["test_acc"] == df["acc_test"]).all() and df["mi_eval"].notna().all()
    table = (out / "table.md").read_text()
    assert "Table 2" in table and "EB1→EB2" in table and "(published)" in table
