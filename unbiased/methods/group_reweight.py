"""group_reweight: each training example weighted by its (y, c) group's inverse frequency,
raised to the power lam (the group-robustness benchmarks' "ReWeight", as a loss weight).

A batch's loss is sum_i w_i l_i / sum_i w_i with w_i = (N / N_g(i))^lam, the groups counted
once on the whole training set: lam 1 gives every present group the same total weight.

On Colored MNIST the groups are (digit, RGB-bin cell): a class's rare cells hold its images
whose noise moved the colour furthest from the class's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from unbiased.data import Benchmark, Split
from unbiased.methods.base import ERM, TrainConfig, rows_of
from unbiased.search import LogUniform


class GroupMethod(ERM):
    """ERM with every training row's group; reports empty_groups, worst_group_loss."""

    def __init__(self, bench: Benchmark, cfg: TrainConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        groups, count = bench.train_groups()
        self.group_of_row = groups.to(self.device)
        self.group_sizes = torch.bincount(self.group_of_row, minlength=count)
        self.empty_groups = int((self.group_sizes == 0).sum())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        metrics = super().evaluate()
        z, y, _ = self.train_eval_set()
        losses = F.cross_entropy(self.f(z), y, reduction="none").double()
        groups = rows_of(self.group_of_row, self.eval_rows)
        count = len(self.group_sizes)
        sums = torch.zeros(count, dtype=losses.dtype, device=losses.device).index_add(
            0, groups, losses)
        sizes = torch.bincount(groups, minlength=count)
        worst = float((sums[sizes > 0] / sizes[sizes > 0]).max())
        return {**metrics, "empty_groups": self.empty_groups, "worst_group_loss": worst}


class GroupReweight(GroupMethod):
    """penalty: the weighted mean loss g and f step on (the plain mean is `loss_task`)."""

    name = "group_reweight"
    # lam 1: every present group the same weight; above it the rarest rows outweigh the rest
    search = {"lam": LogUniform(0.25, 1.0)}
    Config = TrainConfig

    def __init__(self, bench: Benchmark, cfg: TrainConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        sizes = self.group_sizes.double()
        present = sizes > 0
        weight = torch.zeros_like(sizes)
        weight[present] = (sizes.sum() / sizes[present]) ** cfg.lam
        self.row_weight = weight[self.group_of_row].float()

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.lam == 0:
            return super().update(x, y, c, rows, train)
        losses = F.cross_entropy(self.f(self._features(x)), y, reduction="none")
        weights = self.row_weight[rows]
        weighted = (weights * losses).sum() / weights.sum()
        self.model_step(weighted)
        return losses.detach().mean(), weighted.detach()
