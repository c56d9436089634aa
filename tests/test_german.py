"""German credit: loader facts, preprocessing, EO, the SVM baseline and a trial under Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from unbiased.benchmarks.german import data as german_credit
from unbiased.data import DataError, SplitOutputs
from unbiased.metrics import eo_metric, equality_of_opportunity, true_positive_rate

N_ROWS, N_GOOD, N_YOUNG = 1000, 700, 190  # counted in the shipped file (age <= 25: 190)
N_ONE_HOT = 4 + 5 + 11 + 5 + 5 + 5 + 3 + 4 + 3 + 3 + 4 + 2 + 2  # german.doc code lists: 56
N_NUMERIC_WITHOUT_AGE = 6  # attributes 2, 5, 8, 11, 16, 18


@pytest.fixture(scope="module")
def table():
    return german_credit.load_table()


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return german_credit.SHIPPED_FILE.read_text().splitlines()


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "german.data"
    path.write_text("\n".join(lines) + "\n")
    return path


# -- the file ----------------------------------------------------------------------------------
def test_shipped_file_has_the_known_facts(table):
    assert len(table) == N_ROWS
    assert int(table.good.sum()) == N_GOOD
    assert int((table.age <= 25).sum()) == N_YOUNG
    assert table.md5 == german_credit.SHIPPED_MD5
    assert table.age.min() == 19 and table.age.max() == 75


def test_root_may_be_the_file_or_its_directory(tmp_path, lines, table):
    path = _write(tmp_path, lines)
    for root in (path, tmp_path):
        other = german_credit.load_table(root)
        assert other.source == str(path) and other.md5 == table.md5
        assert np.array_equal(other.codes, table.codes)
        assert np.array_equal(other.numeric, table.numeric)


def test_missing_file_is_one_line_saying_how_to_get_it(tmp_path):
    with pytest.raises(DataError) as err:
        german_credit.load_table(tmp_path / "nowhere")
    message = str(err.value)
    assert "\n" not in message
    assert "not found" in message and "german.data" in message
    assert german_credit.DOWNLOAD_URL in message


@pytest.mark.parametrize("line_no, edit, needles", [
    (3, lambda f: f[:-1], ["line 3", "expected 21", "got 20"]),  # class column lost
    (5, lambda f: f + ["1"], ["line 5", "got 22"]),
    (7, lambda f: [*f[:2], "A39", *f[3:]], ["line 7", "attribute 3", "'A39'"]),
    (2, lambda f: [f[0], "six", *f[2:]], ["line 2", "attribute 2", "not a number"]),
    (9, lambda f: [*f[:20], "3"], ["line 9", "class must be 1 (good) or 2 (bad)"]),
])
def test_malformed_file_names_the_line(tmp_path, lines, line_no, edit, needles):
    bad = list(lines)
    bad[line_no - 1] = " ".join(edit(bad[line_no - 1].split()))
    with pytest.raises(DataError) as err:
        german_credit.load_table(_write(tmp_path, bad))
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


# -- x, y, c -----------------------------------------------------------------------------------
def test_x_has_the_documented_one_hot_layout_and_no_age():
    bench = german_credit.build(0)
    names = german_credit.feature_names()
    assert bench.train.x.shape[1] == len(names) == N_ONE_HOT + N_NUMERIC_WITHOUT_AGE == 62
    assert not any(name.startswith("age") for name in names)
    assert names[:4] == [f"checking_status=A1{k}" for k in range(1, 5)]
    assert names[4] == "duration_months"
    x = torch.cat([bench.train.x, bench.eval_splits["test_acc"].x])
    # every categorical attribute has exactly one hot column per row
    for a, codes in german_credit.CATEGORICAL.items():
        cols = [names.index(f"{german_credit.ATTRIBUTE_NAMES[a]}={code}") for code in codes]
        assert torch.equal(x[:, cols].sum(1), torch.ones(len(x)))
    # codes that never occur in the file still keep their (all-zero) column
    for absent in ("purpose=A47", "personal_status_sex=A95"):
        assert x[:, names.index(absent)].abs().sum() == 0


def test_layout_does_not_depend_on_which_codes_appear(tmp_path, lines):
    # The first 40 rows lack several codes (e.g. A44, A410); the width must not change.
    table = german_credit.load_table(_write(tmp_path, lines[:40]))
    assert len(np.unique(table.codes[:, 2])) < len(german_credit.CATEGORICAL[4])
    width = german_credit.build(0, table=table).train.x.shape[1]
    assert width == len(german_credit.feature_names())


def test_y_is_good_credit_and_c_is_young(table):
    bench = german_credit.build(1, table=table)
    train, test = bench.train, bench.eval_splits["test_acc"]
    train_idx, test_idx = german_credit.split_indices(table.good, 1)
    assert torch.equal(train.y, torch.from_numpy(table.good[train_idx].astype(np.int64)))
    assert train.c.shape == (len(train), 1) and train.c.dtype == torch.float32
    assert torch.equal(test.c[:, 0], torch.from_numpy((table.age[test_idx] <= 25)
                                                      .astype(np.float32)))
    assert int(train.c.sum() + test.c.sum()) == N_YOUNG
    assert (bench.name, bench.z_dim, bench.c_dim, bench.num_classes) == ("german", 64, 1, 2)
    assert bench.extra_metrics == [eo_metric]
    g = bench.make_features()
    assert g(train.x[:5]).shape == (5, 64)


def test_numeric_columns_are_scaled_with_training_statistics_only(table):
    bench = german_credit.build(2, table=table)
    names = german_credit.feature_names()
    numeric = [names.index(german_credit.ATTRIBUTE_NAMES[a]) for a in german_credit.NUMERIC
               if a != german_credit.AGE_ATTRIBUTE]
    train = bench.train.x[:, numeric].double()
    test = bench.eval_splits["test_acc"].x[:, numeric].double()
    assert torch.allclose(train.mean(0), torch.zeros(6, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(train.std(0, unbiased=False), torch.ones(6, dtype=torch.float64),
                          atol=1e-5)
    assert (test.mean(0).abs() > 1e-3).any()  # the test split is not re-centred on itself
    # duration of the test rows = (raw - train mean) / train std
    train_idx, test_idx = german_credit.split_indices(table.good, 2)
    raw = table.numeric[:, german_credit.NUMERIC.index(2)]
    expected = (raw[test_idx] - raw[train_idx].mean()) / raw[train_idx].std()
    assert np.allclose(test[:, 0].numpy(), expected, atol=1e-5)


def test_split_is_70_30_stratified_and_fixed_by_the_seed(table):
    train_idx, test_idx = german_credit.split_indices(table.good, 5)
    assert len(train_idx) == 700 and len(test_idx) == 300
    assert np.intersect1d(train_idx, test_idx).size == 0
    assert np.array_equal(np.union1d(train_idx, test_idx), np.arange(N_ROWS))
    assert int(table.good[train_idx].sum()) == 490 and int(table.good[test_idx].sum()) == 210
    again, _ = german_credit.split_indices(table.good, 5)
    other, _ = german_credit.split_indices(table.good, 6)
    assert np.array_equal(train_idx, again) and not np.array_equal(train_idx, other)
    a, b = german_credit.build(5, table=table), german_credit.build(5, table=table)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.c, b.train.c)


# -- equality of opportunity -------------------------------------------------------------------
def test_eo_matches_a_hand_computed_example():
    # young rows 0-3: positives 0, 1, 2 predicted 1, 0, 1 -> TPR 2/3
    # old rows 4-7:   positives 4, 5 predicted 1, 1       -> TPR 1
    y = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0])
    young = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0])
    pred = torch.tensor([1, 0, 1, 1, 1, 1, 0, 1])
    assert true_positive_rate(pred[:4], y[:4]) == pytest.approx(2 / 3)
    assert equality_of_opportunity(pred, y, young.bool()) == pytest.approx(1 / 3)
    # negatives do not count: flipping predictions on y = 0 rows changes nothing
    flipped = torch.where(y == 0, 1 - pred, pred)
    assert equality_of_opportunity(flipped, y, young) == pytest.approx(1 / 3)
    # the hook reads the test split and takes c > 0.5 as young; numpy inputs work too
    outs = {"test_acc": SplitOutputs(pred, y, young.float().unsqueeze(1))}
    assert eo_metric(outs)["eo"] == pytest.approx(1 / 3)
    assert equality_of_opportunity(pred.numpy(), y.numpy(), young.numpy()) == pytest.approx(1 / 3)


def test_eo_is_nan_when_a_group_has_no_positive():
    y = torch.tensor([0, 0, 1, 1])
    young = torch.tensor([True, True, False, False])
    assert math.isnan(equality_of_opportunity(torch.tensor([1, 0, 1, 1]), y, young))
    with pytest.raises(ValueError):
        equality_of_opportunity(torch.ones(3), torch.ones(4), torch.ones(4))


# -- SVM baseline ------------------------------------------------------------------------------
def test_svm_baseline_on_one_seed(table):
    from unbiased.benchmarks.german.spec import SVM_C_GRID, svm_baseline

    result = svm_baseline(german_credit.build(0, table=table), seed=0)
    assert result.C in SVM_C_GRID
    assert 0.6 < result.test_acc <= 1.0
    assert result.train_acc > 0.7
    assert 0.0 <= result.eo <= 1.0


# -- a trial ---------------------------------------------------------------------------------
def test_two_epoch_german_trial_reports_eo_and_mi_eval(table):
    from tests.trials import run_recorded

    config = {"lam": 1.0, "K": 2, "seed": 0, "epochs": 2, "batch_size": 64, "lr": 1e-3,
              "mine_lr": 0.1, "mine_optimizer": "sgd", "mine_hidden": 64,
              "mine_hidden_layers": 1, "device": "cpu", "num_threads": 1, "mi_eval_steps": 20}
    result = run_recorded("german", config, table=table)
    assert result.error is None
    df = result.reports
    assert list(df["epoch"]) == [1, 2]
    assert df["eo"].between(0, 1).all()
    assert df["train_acc"].between(0, 1).all() and df["test_acc"].between(0, 1).all()
    assert df["mi"].map(math.isfinite).all()
    assert math.isnan(df["mi_eval"].iloc[0]) and math.isfinite(df["mi_eval"].iloc[1])
    assert result.checkpoint is not None and result.state["epoch"] == 2
