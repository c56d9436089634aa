"""Non-neural baselines on the same splits as the sweeps (no Ray, no training loop).

German credit: the paper's Table 3 quotes an RBF SVM (Donini et al., 2018) at acc .74 / EO .10.
We refit it on each seed's own 70/30 split, so its row compares with ours split for split,
choosing C by 5-fold cross-validation on the training split only (the test split stays unseen).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from unbiased.data import Benchmark
from unbiased.metrics import EO_SPLIT, accuracy, equality_of_opportunity

SVM_C_GRID: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)
SVM_FOLDS = 5


@dataclass(frozen=True)
class SvmResult:
    """One seed's SVM: the chosen C, its accuracies and EO on the test split."""

    seed: int
    C: float
    cv_acc: float
    train_acc: float
    test_acc: float
    eo: float
    time_s: float


def svm_baseline(bench: Benchmark, seed: int, c_grid: tuple[float, ...] = SVM_C_GRID,
                 folds: int = SVM_FOLDS) -> SvmResult:
    """SVC(kernel="rbf") on the benchmark's x (one-hot + train-scaled numeric, no age), C by
    stratified k-fold CV on the training split, then refit on the whole training split."""
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import SVC

    start = time.perf_counter()
    train, test = bench.train, bench.eval_splits[EO_SPLIT]
    x_train, y_train = train.x.cpu().numpy(), train.y.cpu().numpy()
    search = GridSearchCV(SVC(kernel="rbf"), {"C": list(c_grid)}, scoring="accuracy",
                          cv=StratifiedKFold(folds, shuffle=True, random_state=seed), n_jobs=1)
    search.fit(x_train, y_train)
    pred_test = search.predict(test.x.cpu().numpy())
    return SvmResult(
        seed=seed, C=float(search.best_params_["C"]), cv_acc=float(search.best_score_),
        train_acc=accuracy(search.predict(x_train), y_train),
        test_acc=accuracy(pred_test, test.y),
        eo=equality_of_opportunity(pred_test, test.y, test.c[:, 0] > 0.5),
        time_s=time.perf_counter() - start)
