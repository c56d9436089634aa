"""German credit (UCI Statlog), the fairness benchmark of the paper's Table 3.

A copy of the UCI file ships in this package (CC BY 4.0, Hofmann 1994); codes from `german.doc`.

The protocol (Section 5 and the supplementary of the paper, after Moyer et al. 2018):
- y = 1 for good credit, the positive class of equality of opportunity.
- c = (age <= 25); age is removed from x, so the model can only learn it through correlated
  attributes, which is what the MI penalty targets.
- Categorical attributes are one-hot over german.doc's fixed code lists, so the layout of x
  never depends on which codes a split contains. Numeric attributes are standardised by the
  *training* split only: the test split must not leak into preprocessing.
- A random 70/30 split per seed, *stratified by y*, so differences across seeds come from the
  model, not from a test split with more bad credits. The paper says only "randomly picked".
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from unbiased.data import Benchmark, DataError, TensorSplit
from unbiased.metrics import eo_metric
from unbiased.models import MLPFeatures

FILE_NAME = "german.data"
SHIPPED_FILE = Path(__file__).resolve().parent / "shipped" / FILE_NAME
SHIPPED_MD5 = "6b94c2e35480e671545e52a808a8a549"
DOWNLOAD_URL = "https://archive.ics.uci.edu/dataset/144/statlog+german+credit+data"

N_ATTRIBUTES = 20
AGE_ATTRIBUTE = 13
YOUNG_MAX_AGE = 25  # c = 1 for age <= 25 (the paper's "binarized according to >< 25")
TRAIN_FRACTION = 0.7
Z_DIM = 64
C_DIM = 1
NUM_CLASSES = 2

# Attribute number (1-based, file order) -> short name, from german.doc.
ATTRIBUTE_NAMES: dict[int, str] = {
    1: "checking_status", 2: "duration_months", 3: "credit_history", 4: "purpose",
    5: "credit_amount", 6: "savings", 7: "employment_since", 8: "installment_rate",
    9: "personal_status_sex", 10: "other_debtors", 11: "residence_since", 12: "property",
    13: "age_years", 14: "other_installment_plans", 15: "housing", 16: "existing_credits",
    17: "job", 18: "people_liable", 19: "telephone", 20: "foreign_worker",
}
NUMERIC: tuple[int, ...] = (2, 5, 8, 11, 13, 16, 18)
# The code list of every categorical attribute, exactly as german.doc defines it.
CATEGORICAL: dict[int, tuple[str, ...]] = {
    1: ("A11", "A12", "A13", "A14"),
    3: ("A30", "A31", "A32", "A33", "A34"),
    4: ("A40", "A41", "A42", "A43", "A44", "A45", "A46", "A47", "A48", "A49", "A410"),
    6: ("A61", "A62", "A63", "A64", "A65"),
    7: ("A71", "A72", "A73", "A74", "A75"),
    9: ("A91", "A92", "A93", "A94", "A95"),
    10: ("A101", "A102", "A103"),
    12: ("A121", "A122", "A123", "A124"),
    14: ("A141", "A142", "A143"),
    15: ("A151", "A152", "A153"),
    17: ("A171", "A172", "A173", "A174"),
    19: ("A191", "A192"),
    20: ("A201", "A202"),
}
_CODE_INDEX = {a: {code: i for i, code in enumerate(codes)} for a, codes in CATEGORICAL.items()}
_AGE_COLUMN = NUMERIC.index(AGE_ATTRIBUTE)
NUMERIC_FEATURES: tuple[int, ...] = tuple(a for a in NUMERIC if a != AGE_ATTRIBUTE)


@dataclass(frozen=True)
class GermanTable:
    """The parsed file, before any split-dependent preprocessing (small: cheap to ship)."""

    codes: np.ndarray  # (N, 13) int64: index of each categorical attribute's code
    numeric: np.ndarray  # (N, 7) float64: the NUMERIC attributes in order, age included
    good: np.ndarray  # (N,) bool: class 1
    source: str
    md5: str

    def __len__(self) -> int:
        return len(self.good)

    @property
    def age(self) -> np.ndarray:
        return self.numeric[:, _AGE_COLUMN]


def feature_names() -> list[str]:
    names = []
    for a in range(1, N_ATTRIBUTES + 1):
        if a == AGE_ATTRIBUTE:
            continue
        if a in CATEGORICAL:
            names += [f"{ATTRIBUTE_NAMES[a]}={code}" for code in CATEGORICAL[a]]
        else:
            names.append(ATTRIBUTE_NAMES[a])
    return names


def resolve_path(root: str | os.PathLike | None) -> Path:
    if root is None:
        return SHIPPED_FILE
    path = Path(root).expanduser()
    return path if path.is_file() else path / FILE_NAME


def load_table(root: str | os.PathLike | None = None) -> GermanTable:
    path = resolve_path(root)
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise DataError(f"German credit file not found at {path}: download {FILE_NAME} "
                        f"(Statlog German Credit Data) from {DOWNLOAD_URL} into "
                        f"{path.parent}, or leave out --root to use the copy shipped with "
                        f"the package") from None
    except OSError as exc:
        raise DataError(f"cannot read the German credit file {path}: {exc}") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not the German credit text file (non-ASCII byte at "
                        f"offset {exc.start})") from None
    rows = [parse_line(line, lineno, path)
            for lineno, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not rows:
        raise DataError(f"{path} holds no rows of the German credit file")
    codes, numeric, good = zip(*rows, strict=True)
    return GermanTable(np.asarray(codes, dtype=np.int64), np.asarray(numeric, dtype=np.float64),
                       np.asarray(good, dtype=bool), str(path), hashlib.md5(raw).hexdigest())


def parse_line(line: str, lineno: int, path: Path | str) -> tuple[list[int], list[float], bool]:
    where = f"{path}, line {lineno}"
    fields = line.split()
    if len(fields) != N_ATTRIBUTES + 1:
        raise DataError(f"{where}: expected {N_ATTRIBUTES + 1} space-separated fields "
                        f"(20 attributes + class), got {len(fields)}")
    codes, numbers = [], []
    for a, token in enumerate(fields[:N_ATTRIBUTES], start=1):
        if a in CATEGORICAL:
            index = _CODE_INDEX[a].get(token)
            if index is None:
                raise DataError(f"{where}: attribute {a} ({ATTRIBUTE_NAMES[a]}) has unknown "
                                f"code {token!r}; german.doc allows {','.join(CATEGORICAL[a])}")
            codes.append(index)
        else:
            numbers.append(_number(token, f"{where}: attribute {a} ({ATTRIBUTE_NAMES[a]})"))
    label = fields[N_ATTRIBUTES]
    if label not in ("1", "2"):
        raise DataError(f"{where}: class must be 1 (good) or 2 (bad), got {label!r}")
    return codes, numbers, label == "1"


def _number(token: str, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise DataError(f"{what} is not a number: {token!r}") from None
    if not np.isfinite(value):
        raise DataError(f"{what} is not a finite number: {token!r}")
    return value


def split_indices(good: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in (True, False):
        rows = np.flatnonzero(good == label)
        if len(rows) < 2:
            raise DataError(f"the German credit file needs >= 2 rows of each class to split, "
                            f"got {len(rows)} {'good' if label else 'bad'}")
        rows = rng.permutation(rows)
        n_train = min(len(rows) - 1, max(1, round(TRAIN_FRACTION * len(rows))))
        train.append(rows[:n_train])
        test.append(rows[n_train:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def encode(table: GermanTable, train_idx: np.ndarray, test_idx: np.ndarray
           ) -> tuple[TensorSplit, TensorSplit]:
    numeric = table.numeric[:, [NUMERIC.index(a) for a in NUMERIC_FEATURES]]
    mean = numeric[train_idx].mean(axis=0)
    std = numeric[train_idx].std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant column stays constant (0), not NaN
    blocks = {a: np.eye(len(CATEGORICAL[a]))[table.codes[:, j]]
              for j, a in enumerate(CATEGORICAL)}
    blocks.update({a: ((numeric[:, [j]] - mean[j]) / std[j])
                   for j, a in enumerate(NUMERIC_FEATURES)})
    columns = [blocks[a] for a in range(1, N_ATTRIBUTES + 1) if a != AGE_ATTRIBUTE]
    x = torch.from_numpy(np.concatenate(columns, axis=1).astype(np.float32))
    y = torch.from_numpy(table.good.astype(np.int64))
    c = torch.from_numpy((table.age <= YOUNG_MAX_AGE).astype(np.float32)).unsqueeze(1)
    rows = TensorSplit(x, y, c)
    return rows.subset(torch.from_numpy(train_idx)), rows.subset(torch.from_numpy(test_idx))


def build(seed: int, root: str | os.PathLike | None = None,
          table: GermanTable | None = None) -> Benchmark:
    table = table if table is not None else load_table(root)
    train_idx, test_idx = split_indices(table.good, seed)
    train, test = encode(table, train_idx, test_idx)
    in_features = train.x.shape[1]
    return Benchmark(
        name="german", train=train, eval_splits={"test_acc": test}, num_classes=NUM_CLASSES,
        make_features=lambda: MLPFeatures(in_features, Z_DIM), z_dim=Z_DIM, c_dim=C_DIM,
        extra_metrics=[eo_metric], bias_classes=(2,),
        info={"source": table.source, "md5": table.md5, "seed": seed, "n_train": len(train),
              "n_test": len(test), "x_width": in_features, "stratified_by": "y"})
