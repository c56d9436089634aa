"""group_reweight: each training example weighted by its (y, c) group's inverse frequency,
raised to the power lam (the group-robustness benchmarks' "ReWeight", as a loss weight).

The groups are the benchmark's own: y x each combination of its bias classes
(`unbiased.data.bias_groups`), counted once on the whole training set. A batch's loss is the
weighted mean sum_i w_i l_i / sum_i w_i with w_i = (N / N_g(i))^lam: lam 0 is ERM (its own
step, exactly), lam 1 gives every group present in the training set the same total weight.
A group with no training row weighs nothing; how many there are is every epoch's
`empty_groups`.

On Biased MNIST the groups are (digit, background colour): the few bias-conflicting images
are weighed up. On Colored MNIST every image carries its class's colour plus noise, so the
groups are (digit, RGB-bin cell) and a class's rare cells hold its images whose noise moved
the colour furthest from the class's: those are what lam > 0 weighs up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from unbiased.data import Benchmark, Split, bias_groups
from unbiased.methods.base import ERM, TrainConfig


class GroupMethod(ERM):
    """ERM with every training row's (y, c) group (`group_of_row`, on the device) and the
    training set's group sizes (`group_sizes`); each epoch reports `empty_groups`."""

    def __init__(self, bench: Benchmark, cfg: TrainConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        train = self.bench.train
        groups, count = bias_groups(train.y, train.c, bench.num_classes, bench.bias_classes)
        self.group_of_row = groups.to(self.device)
        self.group_sizes = torch.bincount(self.group_of_row, minlength=count)
        self.empty_groups = int((self.group_sizes == 0).sum())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), "empty_groups": self.empty_groups}


class GroupReweight(GroupMethod):
    """penalty: the weighted mean loss g and f step on (the plain mean is `loss_task`)."""

    name = "group_reweight"
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
        self.model_opt.zero_grad(set_to_none=True)
        weighted.backward()
        self.model_opt.step()
        return losses.detach().mean(), weighted.detach()
