"""German credit (the paper's Table 3) as a registered benchmark.

The paper's Table 3 quotes an RBF SVM (Donini et al., 2018); we refit one on each seed's own
split (`extra_rows`), so its row compares with ours split for split.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from unbiased.benchmarks.spec import (
    PAPER,
    SMOKE,
    BenchmarkSpec,
    Column,
    Protocol,
    PublishedRow,
    TableSpec,
)

if TYPE_CHECKING:
    import pandas as pd

    from unbiased.benchmarks.german.data import GermanTable
    from unbiased.data import Benchmark

GERMAN: dict[str, dict[str, object]] = {
    # Chosen by measurement (docs/MEASURED.md, "German credit's quick preset").
    "quick": {
        "lam": [0.0, 1.0], "seeds": [0, 1, 2], "epochs": 20, "batch_size": 64, "K": 30,
        "lr": 1e-3, "mine_lr": 0.1, "mine_optimizer": "sgd", "inner_z": "fresh",
        "mine_hidden": 64, "mine_hidden_layers": 1, "cpus_per_trial": 1.0,
        "gpus_per_trial": 0.0, "device": "cpu", "mi_eval_steps": 200,
    },
    # CPU: the model is far too small for a GPU to help.
    "paper": {
        "lam": [0.0, 0.1, 0.5, 1.0, 2.0], "seeds": list(range(10)), "epochs": 500,
        "batch_size": 64, "K": 30, "lr": 1e-5, "mine_lr": 0.1, "mine_optimizer": "sgd",
        "inner_z": "fresh", "mine_hidden": 64, "mine_hidden_layers": 1, "cpus_per_trial": 1.0,
        "gpus_per_trial": 0.0, "device": "cpu", "mi_eval_steps": 200,
    },
}

# Table 3: German credit, accuracy and equality of opportunity (lower is fairer).
COLUMNS: tuple[str, ...] = ("Acc.", "EO")
PUBLISHED: tuple[PublishedRow, ...] = tuple(
    PublishedRow(row, dict(zip(COLUMNS, values, strict=True)), f"{PAPER}, Table 3")
    for row, values in (
        ("SVM", ((.74, .03), (.10, .06))),
        ("FERM", ((.73, .04), (.05, .03))),
        ("NN", ((.74, .04), (.47, .19))),
        ("NN + χ²", ((.73, .03), (.25, .14))),
        ("Ours (λ=1)", ((.72, .03), (.05, .05))),
    ))
TABLE = TableSpec(
    benchmark="german", name="German credit", table="Table 3", measures="accuracy, EO",
    columns=(Column("Acc.", ("test_acc",)), Column("EO", ("eo",))),
    published=PUBLISHED, erm_row="NN (λ=0)", baselines=(("svm", "SVM"),),
    note="EO = |TPR(young) − TPR(old)|, lower is fairer.",
    protocol=Protocol(
        comparable=frozenset({"paper"}),
        notes={"quick": "{preset} preset: {epochs} epochs at lr {lr} (the paper: 500 at "
                        "1e-05) " + SMOKE}),
)


def load(values: dict) -> tuple[dict[str, object], str]:
    """Parse the file once in the driver, so a bad --root fails before Ray starts."""
    from unbiased.benchmarks.german import data as german_credit

    table = german_credit.load_table(values.get("root"))
    return {"table": table}, f"{len(table)} rows from {table.source}"


def fetch(values: dict) -> Iterator[str]:
    """`--fetch-data`: the file checked (no download: UCI serves a zip behind a web page)."""
    from pathlib import Path

    from unbiased.benchmarks.german import data as german_credit
    from unbiased.data import DataError

    root = values.get("root")
    path = german_credit.resolve_path(root)
    if root is not None and not path.is_file():
        raise DataError(f"German credit: {path} is missing and this program does not download "
                        f"it: get {german_credit.FILE_NAME} (Statlog German Credit Data) "
                        f"from {german_credit.DOWNLOAD_URL} into {path.parent}, or leave out "
                        f"--root: the package ships a copy")
    table = german_credit.load_table(root)
    size = f"{Path(table.source).stat().st_size:,} bytes, {len(table)} rows"
    if root is None:
        yield (f"nothing to fetch: German credit is the UCI file shipped in the package, "
               f"{table.source} ({size})")
        return
    same = ("the UCI file's md5" if table.md5 == german_credit.SHIPPED_MD5 else
            f"md5 {table.md5}, not the UCI file's {german_credit.SHIPPED_MD5}")
    yield f"German credit in {table.source} ({size}, {same})"


def build(config: dict, table: GermanTable | None = None) -> Benchmark:
    from unbiased.benchmarks.german import data as german_credit

    return german_credit.build(int(config["seed"]), config.get("root"), table=table)


SVM_METHOD = "svm"
SVM_C_GRID: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)
SVM_FOLDS = 5
EXPERIMENT = "german_grid"  # the experiment of `python -m sweeps german`


@dataclass(frozen=True)
class SvmResult:
    seed: int
    C: float
    cv_acc: float
    train_acc: float
    test_acc: float
    eo: float
    time_s: float


def svm_baseline(bench: Benchmark, seed: int) -> SvmResult:
    """SVC(kernel="rbf"), C by stratified k-fold CV on the training split only."""
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import SVC

    from unbiased.metrics import EO_SPLIT, accuracy, equality_of_opportunity

    start = time.perf_counter()
    train, test = bench.train, bench.eval_splits[EO_SPLIT]
    x_train, y_train = train.x.cpu().numpy(), train.y.cpu().numpy()
    search = GridSearchCV(SVC(kernel="rbf"), {"C": list(SVM_C_GRID)}, scoring="accuracy",
                          cv=StratifiedKFold(SVM_FOLDS, shuffle=True, random_state=seed), n_jobs=1)
    search.fit(x_train, y_train)
    pred_test = search.predict(test.x.cpu().numpy())
    return SvmResult(
        seed=seed, C=float(search.best_params_["C"]), cv_acc=float(search.best_score_),
        train_acc=accuracy(search.predict(x_train), y_train),
        test_acc=accuracy(pred_test, test.y),
        eo=equality_of_opportunity(pred_test, test.y, test.c[:, 0] > 0.5),
        time_s=time.perf_counter() - start)


def svm_rows(results: list[SvmResult], like: pd.DataFrame) -> pd.DataFrame:
    """Rows like `like`; what a non-MI method lacks is set so the analysis can group them."""
    import pandas as pd

    node = socket.gethostname()
    rows = [{
        "experiment": EXPERIMENT, "trial_id": f"svm_seed{r.seed}", "benchmark": "german",
        "method": SVM_METHOD, "sigma": math.nan, "lam": math.nan, "K": 0, "seed": r.seed,
        "epoch": 1, "mi": math.nan, "train_acc": r.train_acc, "test_acc": r.test_acc,
        "time_s": r.time_s, "mi_eval": math.nan, "loss_task": math.nan, "mi_batch": math.nan,
        "epochs": 1, "start_epoch": 1, "node": node, "status": "ok", "eo": r.eo,
        "svm_C": r.C,
    } for r in results]
    df = pd.DataFrame(rows)
    columns = list(like.columns) + [c for c in df.columns if c not in like.columns]
    df = df.reindex(columns=columns)
    return df.astype({c: like[c].dtype for c in like.columns if c in df.columns})


def extra_rows(values: dict, loaded: dict, like: pd.DataFrame) -> pd.DataFrame:
    from unbiased.benchmarks.german import data as german_credit

    return svm_rows([svm_baseline(german_credit.build(seed, table=loaded["table"]), seed)
                     for seed in values["seeds"]], like)


SPEC = BenchmarkSpec(
    name="german", title="German credit",
    description="German credit grid (the paper's Table 3 and its lambda bar plots): lambda x "
                "K x seed.",
    presets=GERMAN, data_axes=(), build_keys=("root",), load=load, fetch=fetch, build=build,
    table=TABLE,
    columns=("eo",), column_labels={"eo": "EO"}, trade_off=("eo", "EO gap (lower is fairer)"),
    summary=("train_acc", "test_acc", "eo"), extra_rows=extra_rows)
