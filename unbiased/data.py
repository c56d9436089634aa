"""What a benchmark hands to the training loop, as data: the loop never asks which it runs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

# Inputs, labels, bias attribute, all on the split's device.
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class DataError(Exception):
    """A data set is missing, unreadable or malformed: one line saying how to fix it."""


class DataMissing(DataError):
    """Data the program downloads could not be downloaded here (no network, as on many
    clusters' compute nodes). `fetched_to`: where `--fetch-data` puts it when not under the
    data root."""

    def __init__(self, message: str, fetched_to: str | None = None):
        super().__init__(message)
        self.fetched_to = fetched_to


@dataclass
class TensorSplit:
    """Inputs x, labels y (int64), bias attribute c (float: the statistics network's input)."""

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
        return TensorSplit(self.x[rows], self.y[rows], self.c[rows])

    def batches(self, batch_size: int, order: torch.Tensor | None = None) -> Iterator[Batch]:
        """Consecutive mini-batches of `order` (row indices), or of the rows in order."""
        n = len(self) if order is None else len(order)
        for i in range(0, n, batch_size):
            idx = slice(i, i + batch_size) if order is None else order[i:i + batch_size]
            yield self.x[idx], self.y[idx], self.c[idx]


class Split(Protocol):
    """y and c on the training device; mini-batches in a row order the loop chooses."""

    y: torch.Tensor
    c: torch.Tensor

    def __len__(self) -> int: ...

    def batches(self, batch_size: int, order: torch.Tensor | None = None
                ) -> Iterator[Batch]: ...

    def to(self, device: torch.device | str) -> Split: ...

    def subset(self, rows: torch.Tensor) -> Split: ...


class LoaderSplit:
    """A split whose inputs are read per row by `dataset[i]` (e.g. decoding a JPEG) through a
    DataLoader; the loop still picks the row order.

    Every mini-batch is cut into one piece per worker, so even a single batch (an inner MINE
    step) is decoded by all workers at once. Each concurrent pass gets its own DataLoader.
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
        # Each loader's batch sampler: a list of row pieces, refilled before each pass, so a
        # DataLoader with persistent workers follows the loop's own row order.
        self._loaders: list[tuple[DataLoader, list[list[int]]]] = []
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
        pieces: list[list[int]] = []
        loader = DataLoader(self.dataset, batch_sampler=pieces, num_workers=self.num_workers,
                            persistent_workers=self.num_workers > 0)
        self._loaders.append((loader, pieces))
        return len(self._loaders) - 1

    def batches(self, batch_size: int, order: torch.Tensor | None = None) -> Iterator[Batch]:
        rows = list(range(len(self))) if order is None else order.tolist()
        pieces = max(1, self.num_workers)
        piece = max(1, math.ceil(batch_size / pieces))
        # Pieces never straddle two batches: each batch is cut on its own.
        chunks = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        slot = self._free_loader()
        loader, order_pieces = self._loaders[slot]
        cut = [[chunk[j:j + piece] for j in range(0, len(chunk), piece)] for chunk in chunks]
        order_pieces[:] = [p for parts in cut for p in parts]
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
    pred: torch.Tensor
    y: torch.Tensor
    c: torch.Tensor


@dataclass
class Benchmark:
    """A benchmark = its data plus how to build g. `eval_splits`: by report name."""

    name: str
    train: Split
    eval_splits: dict[str, Split]
    num_classes: int
    make_features: Callable[[], nn.Module]
    z_dim: int
    c_dim: int
    extra_metrics: list[MetricFn] = field(default_factory=list)
    info: dict[str, object] = field(default_factory=dict)
    # Classes per bias head: c is one one-hot block per head, or one class-index column per
    # head (German: young = 1).
    bias_classes: tuple[int, ...] = ()
    # Each training row's group and the count, where not y x the bias classes.
    groups: tuple[torch.Tensor, int] | None = None
    # The groups of `<split>_worst_acc` (None: not reported). Colored MNIST's are its palette
    # groups: its 5,120 RGB cells hold a handful of test rows each.
    report_groups: Callable[[Split], tuple[torch.Tensor, int]] | None = None

    def to(self, device: torch.device | str) -> Benchmark:
        groups = None if self.groups is None else (self.groups[0].to(device), self.groups[1])
        return dataclasses.replace(self, train=self.train.to(device),
                                   eval_splits={k: v.to(device)
                                                for k, v in self.eval_splits.items()},
                                   groups=groups)

    def train_groups(self) -> tuple[torch.Tensor, int]:
        if self.groups is not None:
            return self.groups
        return bias_groups(self.train.y, self.train.c, self.num_classes, self.bias_classes)


# The same validation rows for every method and setting of a seed.
VAL_SEED_OFFSET = 4_000_037
VAL_SPLIT = "val_acc"  # the validation split's name among a benchmark's evaluation splits


def hold_out(bench: Benchmark, fraction: float, seed: int) -> Benchmark:
    """`fraction` of the training rows held out as `val_acc`, a uniform draw."""
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
    groups = None if bench.groups is None else (bench.groups[0][train_rows], bench.groups[1])
    return dataclasses.replace(
        bench, train=bench.train.subset(train_rows), groups=groups,
        eval_splits={**bench.eval_splits, VAL_SPLIT: bench.train.subset(val_rows)},
        info={**bench.info, "n_train": n - held, "n_val": held})


def group_accuracies(pred: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, count: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's accuracy and size (accuracy NaN where the group has no row)."""
    right = torch.zeros(count, dtype=torch.float64, device=pred.device).index_add(
        0, groups, (pred == y).double())
    sizes = torch.bincount(groups, minlength=count)
    return right / sizes, sizes


# The same capped rows at every epoch, for every method of a seed.
GROUP_ROWS_SEED_OFFSET = 5_000_011


def capped_group_rows(groups: torch.Tensor, cap: int, seed: int) -> torch.Tensor:
    """At most `cap` rows of each group: under balanced weights, the same distribution."""
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
    """w_i = N / (G n_g(i)), G the present groups: every group weighs the same, so (with
    every (y, c) group present) c is independent of y."""
    sizes = torch.bincount(groups, minlength=count).double()
    present = int((sizes > 0).sum())
    return (len(groups) / (present * sizes[groups])).float()


def bias_groups(y: torch.Tensor, c: torch.Tensor, num_classes: int,
                classes: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """Each row's (y, c) group and the count (Colored MNIST: 10 x 8^3 RGB-bin cells)."""
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
    if c.shape[1] == sum(classes):
        return torch.stack([block.argmax(1) for block in c.split(list(classes), dim=1)], 1)
    if c.shape[1] == len(classes):
        return c.round().long()
    raise ValueError(f"c has {c.shape[1]} columns: neither one-hot blocks of {classes} nor "
                     f"one class index per head")


class GroupSampler:
    """Rows drawn group by group (DomainBed's per-group mini-batches): each batch cycles the
    present groups in a fresh random order over its slots, each slot a row of its group
    drawn with replacement."""

    def __init__(self, group_of_row: torch.Tensor, count: int):
        self.device = group_of_row.device
        self.rows = len(group_of_row)
        self.sizes = torch.bincount(group_of_row, minlength=count)
        self.present = torch.nonzero(self.sizes > 0).squeeze(1)
        self.by_group = torch.argsort(group_of_row, stable=True)
        self.starts = torch.cumsum(self.sizes, 0) - self.sizes

    def epoch(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        return self._draw(self.rows, batch_size, generator)

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
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
