"""What a benchmark hands to the training loop: tensors, a feature extractor, metric hooks.

The loop never asks which benchmark it runs; everything benchmark-specific lives here as data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

# One mini-batch as the loop sees it: inputs, labels, bias attribute, all on the split's device.
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class DataError(Exception):
    """A data set is missing, unreadable or malformed. The message is one line saying what
    and how to fix it; command-line front ends print it without a traceback."""


class DataMissing(DataError):
    """Data the program downloads is not there and could not be downloaded on this machine
    (no network, as on many clusters' compute nodes): a machine with network can fetch it
    (a sweep driver's `--fetch-data`, sweeps/fetch.py). `fetched_to`: where that fetch puts
    it when not under the data root (the sweep reads it there); None: under the root."""

    def __init__(self, message: str, fetched_to: str | None = None):
        super().__init__(message)
        self.fetched_to = fetched_to


@dataclass
class TensorSplit:
    """One split held as tensors: inputs x, labels y (int64), bias attribute c (float, one-hot
    or binary, the input of the statistics network)."""

    x: torch.Tensor
    y: torch.Tensor
    c: torch.Tensor

    def __post_init__(self) -> None:
        if not (len(self.x) == len(self.y) == len(self.c)):
            raise ValueError(f"split sizes differ: x {len(self.x)}, y {len(self.y)}, "
                             f"c {len(self.c)}")

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device | str) -> TensorSplit:
        return TensorSplit(self.x.to(device), self.y.to(device), self.c.to(device))

    def subset(self, rows: torch.Tensor) -> TensorSplit:
        """The split's `rows` (indices), in that order."""
        return TensorSplit(self.x[rows], self.y[rows], self.c[rows])

    def batches(self, batch_size: int, order: torch.Tensor | None = None) -> Iterator[Batch]:
        """Consecutive mini-batches of `order` (row indices), or of the rows in order."""
        n = len(self) if order is None else len(order)
        for i in range(0, n, batch_size):
            if order is None:
                yield (self.x[i:i + batch_size], self.y[i:i + batch_size],
                       self.c[i:i + batch_size])
            else:
                idx = order[i:i + batch_size]
                yield self.x[idx], self.y[idx], self.c[idx]


class Split(Protocol):
    """What the training loop needs of a split: its size, y and c as tensors (small, on the
    training device) and mini-batches of (x, y, c) in a row order the loop chooses.
    TensorSplit holds x as a tensor; LoaderSplit reads x through a DataLoader."""

    y: torch.Tensor
    c: torch.Tensor

    def __len__(self) -> int: ...

    def batches(self, batch_size: int, order: torch.Tensor | None = None
                ) -> Iterator[Batch]: ...

    def to(self, device: torch.device | str) -> Split: ...

    def subset(self, rows: torch.Tensor) -> Split: ...


class _OrderSampler(Sampler[list[int]]):
    """A batch sampler that replays the list of row pieces it is given before each pass, so
    a DataLoader with persistent workers follows the loop's own generator."""

    def __init__(self) -> None:
        self.pieces: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)


class LoaderSplit:
    """A split whose inputs are read per row by `dataset[i]` (e.g. decoding a JPEG), through
    a DataLoader with `num_workers` processes. y and c stay tensors. The loop still picks the
    row order (from its own generator), so a run is reproducible and resumable exactly as with
    a TensorSplit.

    Every mini-batch is cut into one piece per worker and put back together here, so even a
    pass of a single batch (an inner MINE step of Algorithm 1 draws one batch at a time) is
    decoded by all workers at once. Each concurrent pass (the epoch's batches, the inner
    batches drawn meanwhile) gets its own DataLoader, made on first use; workers persist.
    """

    def __init__(self, dataset: Dataset, y: torch.Tensor, c: torch.Tensor,
                 num_workers: int = 0, device: torch.device | str = "cpu"):
        if not (len(dataset) == len(y) == len(c)):  # type: ignore[arg-type]
            raise ValueError(f"split sizes differ: dataset {len(dataset)}, "  # type: ignore
                             f"y {len(y)}, c {len(c)}")
        self.dataset = dataset
        self.device = torch.device(device)
        self.y = y.to(self.device)
        self.c = c.to(self.device)
        self.num_workers = num_workers
        self._loaders: list[tuple[DataLoader, _OrderSampler]] = []
        self._busy: set[int] = set()

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device | str) -> LoaderSplit:
        return LoaderSplit(self.dataset, self.y, self.c, self.num_workers, device)

    def subset(self, rows: torch.Tensor) -> LoaderSplit:
        return LoaderSplit(Subset(self.dataset, rows.tolist()), self.y[rows], self.c[rows],
                           self.num_workers, self.device)

    def __getstate__(self) -> dict:
        # DataLoaders (and their worker processes) stay with the process that made them.
        return {**self.__dict__, "_loaders": [], "_busy": set()}

    def _free_loader(self) -> int:
        for slot in range(len(self._loaders)):
            if slot not in self._busy:
                return slot
        sampler = _OrderSampler()
        loader = DataLoader(self.dataset, batch_sampler=sampler, num_workers=self.num_workers,
                            persistent_workers=self.num_workers > 0)
        self._loaders.append((loader, sampler))
        return len(self._loaders) - 1

    def batches(self, batch_size: int, order: torch.Tensor | None = None) -> Iterator[Batch]:
        rows = list(range(len(self))) if order is None else order.tolist()
        pieces = max(1, self.num_workers)
        piece = max(1, math.ceil(batch_size / pieces))
        # Pieces never straddle two batches: each batch is cut on its own.
        chunks = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        slot = self._free_loader()
        loader, sampler = self._loaders[slot]
        cut = [[chunk[j:j + piece] for j in range(0, len(chunk), piece)] for chunk in chunks]
        sampler.pieces = [p for parts in cut for p in parts]
        self._busy.add(slot)
        try:
            it = iter(loader)
            for chunk, parts in zip(chunks, cut, strict=True):
                x = torch.cat([next(it) for _ in parts])
                if self.device.type == "cuda":
                    x = x.pin_memory()
                idx = torch.as_tensor(chunk, device=self.device)
                yield x.to(self.device, non_blocking=True), self.y[idx], self.c[idx]
        finally:
            self._busy.discard(slot)


# Extra per-epoch metrics: (eval outputs by split name) -> {metric name: value}.
MetricFn = Callable[[dict[str, "SplitOutputs"]], dict[str, float]]


@dataclass
class SplitOutputs:
    """Predictions of the current model on one split, for metric hooks."""

    pred: torch.Tensor
    y: torch.Tensor
    c: torch.Tensor


@dataclass
class Benchmark:
    """A benchmark = its data plus how to build g. `eval_splits` maps a report name
    (e.g. "test_acc") to a split whose accuracy is reported under that name."""

    name: str
    train: Split
    eval_splits: dict[str, Split]
    num_classes: int
    make_features: Callable[[], nn.Module]
    z_dim: int
    c_dim: int
    extra_metrics: list[MetricFn] = field(default_factory=list)
    info: dict[str, object] = field(default_factory=dict)
    # The bias attribute as classes, for methods with a bias head: classes per head. c is
    # either one one-hot block per head (sum(bias_classes) columns) or one column per head
    # holding the class index (German: young = 1). See `bias_targets`.
    bias_classes: tuple[int, ...] = ()
    # Each training row's (y, bias) group and how many groups there are, when the benchmark
    # groups its rows otherwise than y x its bias classes (Colored MNIST's `--groups
    # palette`); None: `bias_groups` of the training split. See `train_groups`.
    groups: tuple[torch.Tensor, int] | None = None
    # How any split's rows fall into the groups whose accuracies are reported (each
    # evaluation split's `<name>_worst_acc`, the validation split's too): None, no
    # worst-group accuracy. Colored MNIST's are its palette groups whatever `--groups` a
    # method trains on (its 5,120 RGB cells hold a handful of test rows each).
    report_groups: Callable[[Split], tuple[torch.Tensor, int]] | None = None

    def to(self, device: torch.device | str) -> Benchmark:
        groups = None if self.groups is None else (self.groups[0].to(device), self.groups[1])
        return dataclasses.replace(self, train=self.train.to(device),
                                   eval_splits={k: v.to(device)
                                                for k, v in self.eval_splits.items()},
                                   groups=groups)

    def train_groups(self) -> tuple[torch.Tensor, int]:
        """Each training row's group index (on the training split's device) and the number
        of groups: the benchmark's own grouping, else y x its bias classes."""
        if self.groups is not None:
            return self.groups
        return bias_groups(self.train.y, self.train.c, self.num_classes, self.bias_classes)


# The validation rows are drawn by a generator of their own, seeded from the trial's seed
# plus this: the same rows for every method and setting of a seed.
VAL_SEED_OFFSET = 4_000_037
VAL_SPLIT = "val_acc"  # the validation split's name among a benchmark's evaluation splits


def hold_out(bench: Benchmark, fraction: float, seed: int) -> Benchmark:
    """The benchmark with `fraction` of its training rows held out as a validation split
    (`val_acc` among its evaluation splits): a uniform random draw of the training rows, so
    drawn like them (the same bias), and the rows left train. The methods' groups follow
    their rows."""
    if not 0 < fraction < 1:
        raise ValueError(f"the validation fraction must be in (0, 1), got {fraction}")
    n = len(bench.train)
    held = round(n * fraction)
    if not 0 < held < n:
        raise ValueError(f"a validation fraction of {fraction:g} of {n} training rows "
                         f"holds out {held}: nothing to validate on or to train on")
    gen = torch.Generator().manual_seed(seed + VAL_SEED_OFFSET)
    order = torch.randperm(n, generator=gen)
    device = bench.train.y.device
    val_rows = order[:held].sort().values.to(device)
    train_rows = order[held:].sort().values.to(device)
    groups = None
    if bench.groups is not None:
        groups = (bench.groups[0][train_rows], bench.groups[1])
    return dataclasses.replace(
        bench, train=bench.train.subset(train_rows), groups=groups,
        eval_splits={**bench.eval_splits, VAL_SPLIT: bench.train.subset(val_rows)},
        info={**bench.info, "n_train": n - held, "n_val": held})


def worst_group_name(split: str) -> str:
    """The report name of a split's worst-group accuracy: test_acc -> test_worst_acc."""
    return split.removesuffix("_acc") + "_worst_acc"


def group_accuracies(pred: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, count: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's accuracy and size (accuracy NaN where the group has no row)."""
    right = torch.zeros(count, dtype=torch.float64, device=pred.device).index_add(
        0, groups, (pred == y).double())
    sizes = torch.bincount(groups, minlength=count)
    return right / sizes, sizes


# The rows a capped group-balanced estimate reads are drawn by a generator seeded from the
# trial's seed plus this: the same rows at every epoch, for every method of a seed.
GROUP_ROWS_SEED_OFFSET = 5_000_011


def capped_group_rows(groups: torch.Tensor, cap: int, seed: int) -> torch.Tensor:
    """Row indices (ascending) of at most `cap` rows of each group, drawn uniformly without
    replacement by `seed`: every row of a group of `cap` rows or fewer. Under group-balanced
    weights each group weighs the same whatever its size, so the capped rows are a sample of
    the same distribution; where the bias is strong most rows sit in a few large groups and
    the cap reads a tenth of them."""
    if cap < 1:
        raise ValueError(f"the rows kept of each group must be at least 1, got {cap}")
    gen = torch.Generator().manual_seed(seed + GROUP_ROWS_SEED_OFFSET)
    order = torch.randperm(len(groups), generator=gen).to(groups.device)
    # Stable sort by group of a random order: each group's rows in random order, then the
    # rank of each row within its group.
    by_group = order[torch.sort(groups[order], stable=True).indices]
    sorted_groups = groups[by_group]
    starts = torch.searchsorted(sorted_groups, sorted_groups, right=False)
    rank = torch.arange(len(groups), device=groups.device) - starts
    return by_group[rank < cap].sort().values


def balanced_weights(groups: torch.Tensor, count: int) -> torch.Tensor:
    """Per-row weights under which every group present among `groups` weighs the same:
    w_i = N / (G n_g(i)), G the present groups (mean 1 over the rows). Weighted by them, the
    rows are a sample of the group-balanced distribution, where (if every (y, c) group is
    present) the bias c is independent of the label y."""
    sizes = torch.bincount(groups, minlength=count).double()
    present = int((sizes > 0).sum())
    return (len(groups) / (present * sizes[groups])).float()


def bias_groups(y: torch.Tensor, c: torch.Tensor, num_classes: int,
                classes: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """Each row's (y, c) group, an index in [0, groups), and how many groups there are:
    num_classes x the product of the bias classes (one per head's class combination; Colored
    MNIST: 10 x 8^3 RGB-bin cells)."""
    if not classes:
        raise ValueError("this benchmark has no bias classes (Benchmark.bias_classes) to "
                         "group its rows by")
    heads = bias_targets(c, classes)
    cell = torch.zeros_like(y)
    for head, size in enumerate(classes):
        cell = cell * size + heads[:, head]
    cells = math.prod(classes)
    return y * cells + cell, num_classes * cells


def bias_targets(c: torch.Tensor, classes: tuple[int, ...]) -> torch.Tensor:
    """(N, heads) int64 class indices of the bias attribute c (see Benchmark.bias_classes)."""
    if c.shape[1] == sum(classes):
        return torch.stack([block.argmax(1) for block in c.split(list(classes), dim=1)], 1)
    if c.shape[1] == len(classes):
        return c.round().long()
    raise ValueError(f"c has {c.shape[1]} columns: neither one-hot blocks of {classes} nor "
                     f"one class index per head")


class GroupSampler:
    """Rows drawn group by group (DomainBed's per-group mini-batches): each batch lists the
    groups present among `group_of_row` in a fresh random order, cycled over its slots, and
    each slot takes a row of its group uniformly (with replacement). A batch at least as large
    as the number of groups holds every group; a smaller one a random few each step."""

    def __init__(self, group_of_row: torch.Tensor, count: int):
        self.device = group_of_row.device
        self.rows = len(group_of_row)
        self.sizes = torch.bincount(group_of_row, minlength=count)
        self.present = torch.nonzero(self.sizes > 0).squeeze(1)
        self.by_group = torch.argsort(group_of_row, stable=True)
        self.starts = torch.cumsum(self.sizes, 0) - self.sizes

    def epoch(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """An epoch's rows, as many as the training set, batch after batch."""
        return self._draw(self.rows, batch_size, generator)

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """One batch of `size` rows."""
        return self._draw(size, size, generator)

    def _draw(self, n: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        where, device = generator.device, self.device
        steps = -(-n // batch_size)
        orders = torch.argsort(torch.rand(steps, len(self.present), generator=generator,
                                          device=where), dim=1).to(device)
        slot = torch.arange(n, device=device)
        group = self.present[orders[slot // batch_size,
                                    (slot % batch_size) % len(self.present)]]
        within = (torch.rand(n, generator=generator, device=where).to(device)
                  * self.sizes[group]).long().clamp_max(self.sizes[group] - 1)
        return self.by_group[self.starts[group] + within]
