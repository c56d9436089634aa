"""group_dro: Group DRO's online algorithm (Sagawa et al., ICLR 2020, Algorithm 1) over the
benchmark's (y, c) groups.

Weights q over the groups (uniform over those present in the training set; a group with no
training row keeps weight 0, and each epoch reports how many there are, `empty_groups`). At
each mini-batch, with l_g the mean loss of group g's rows in it (0 for a group with none):
q_g <- q_g exp(eta l_g), q normalised, and the robust loss is sum_g q_g l_g (their code's
order: q moves first). lam weighs the robust loss against the task loss:
L_task + lam sum_g q_g l_g, so lam 0 is ERM's own step (q stays uniform) and a large lam
approaches Group DRO alone (its loss scaled). eta is `--dro-step` (their
default, 0.01); their group adjustment C / sqrt(n_g) is not used. q is in the method's state:
a restored trial continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from unbiased.data import Benchmark, Split
from unbiased.methods.base import TrainConfig
from unbiased.methods.group_reweight import GroupMethod
from unbiased.settings import setting


@dataclass
class GroupDROConfig(TrainConfig):
    dro_step: float = setting(
        0.01, "group_dro: step size eta of the group weights' exponentiated-gradient update "
              "(Sagawa et al.'s default)", gt=0)


def robust_loss(q: torch.Tensor, losses: torch.Tensor, groups: torch.Tensor,
                step: float) -> torch.Tensor:
    """One online Group DRO step: q (the groups' weights, updated in place) moved by the
    batch's per-group mean losses; returns sum_g q_g l_g."""
    sums = torch.zeros_like(q).index_add(0, groups, losses)
    counts = torch.zeros_like(q).index_add(0, groups, torch.ones_like(losses))
    means = sums / counts.clamp_min(1.0)
    with torch.no_grad():
        q.mul_(torch.exp(step * means.detach()))
        q.div_(q.sum())
    return (q * means).sum()


class GroupDRO(GroupMethod):
    """penalty: the robust loss sum_g q_g l_g of the batch."""

    name = "group_dro"
    Config = GroupDROConfig
    cfg: GroupDROConfig

    def __init__(self, bench: Benchmark, cfg: GroupDROConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        present = (self.group_sizes > 0).float()
        self.q = present / present.sum()

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.lam == 0:
            return super().update(x, y, c, rows, train)
        losses = F.cross_entropy(self.f(self._features(x)), y, reduction="none")
        groups = self.group_of_row[rows]
        return self.task_step(losses.mean(), lambda detach: robust_loss(
            self.q, losses.detach() if detach else losses, groups, self.cfg.dro_step))

    def extra_state(self) -> dict:
        return {"dro_q": self.q}

    def load_extra_state(self, state: dict) -> None:
        if "dro_q" in state:
            self.q.copy_(state["dro_q"])
