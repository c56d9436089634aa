"""group_dro: Group DRO's online algorithm (Sagawa et al., ICLR 2020) over the benchmark's
groups (`Benchmark.train_groups`).

Weights q over the groups present in the training set, uniform at the start. At each
mini-batch, with l_g the mean loss of group g's rows in it: q_g <- q_g exp(eta (l_g + C /
sqrt(n_g))), q normalised, and the robust loss is sum_g q_g l_g (q moves first, as in their
loss.py).

`--dro-loss robust` (the published method): g and f minimise the robust loss alone. lam > 0
only switches it on (Adam's step does not depend on the loss's scale), so a sweep varies
eta, C and `--weight-decay` (Sagawa et al.: Group DRO needs strong L2 or early stopping).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from unbiased.data import Benchmark, Split
from unbiased.methods.base import TrainConfig
from unbiased.methods.group_reweight import GroupMethod
from unbiased.search import LogUniform
from unbiased.settings import setting

DRO_LOSSES: tuple[str, ...] = ("robust", "penalty")


@dataclass
class GroupDROConfig(TrainConfig):
    dro_step: float = setting(
        0.01, "group_dro: step size eta of the group weights' exponentiated-gradient update "
              "(Sagawa et al.'s default)", gt=0)
    dro_loss: str = setting(
        "robust", "group_dro: robust = g and f minimise sum_g q_g l_g alone (the published "
                  "method; lam > 0 only switches it on); penalty = L_task + lam sum_g q_g l_g "
                  "(this project's earlier rows)", choices=DRO_LOSSES)
    dro_adjustment: float = setting(
        0.0, "group_dro: Sagawa et al.'s generalisation adjustment C: q moves by l_g + "
             "C / sqrt(n_g), n_g the group's training rows", ge=0)


def robust_loss(q: torch.Tensor, losses: torch.Tensor, groups: torch.Tensor,
                step: float, adjustment: torch.Tensor | None = None) -> torch.Tensor:
    """One online Group DRO step: q moved in place; returns sum_g q_g l_g."""
    sums = torch.zeros_like(q).index_add(0, groups, losses)
    counts = torch.zeros_like(q).index_add(0, groups, torch.ones_like(losses))
    means = sums / counts.clamp_min(1.0)
    with torch.no_grad():
        moved = means.detach() if adjustment is None else means.detach() + adjustment
        q.mul_(torch.exp(step * moved))
        q.div_(q.sum())
    return (q * means).sum()


class GroupDRO(GroupMethod):
    """penalty: the robust loss sum_g q_g l_g of the batch."""

    name = "group_dro"
    search = {"dro_step": LogUniform(1e-3, 1e-1)}  # lam only switches it on
    Config = GroupDROConfig
    own_sampler = "groups"
    cfg: GroupDROConfig

    def __init__(self, bench: Benchmark, cfg: GroupDROConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        present = (self.group_sizes > 0).float()
        self.q = present / present.sum()
        self.adjustment = (cfg.dro_adjustment / self.group_sizes.clamp_min(1).float().sqrt()
                           if cfg.dro_adjustment > 0 else None)

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.lam == 0:
            return super().update(x, y, c, rows, train)
        losses = F.cross_entropy(self.f(self._features(x)), y, reduction="none")
        groups = self.group_of_row[rows]
        step, adjust = self.cfg.dro_step, self.adjustment
        if self.cfg.dro_loss == "penalty":
            return self.task_step(losses.mean(), lambda detach: robust_loss(
                self.q, losses.detach() if detach else losses, groups, step, adjust))
        robust = robust_loss(self.q, losses, groups, step, adjust)
        self.model_step(robust)
        return losses.detach().mean(), robust.detach()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        q = self.q[self.q > 0]
        return {**super().evaluate(), "dro_q_max": float(self.q.max()),
                "dro_q_entropy": float(-(q * q.log()).sum())}

    def extra_state(self) -> dict:
        return {"dro_q": self.q}

    def load_extra_state(self, state: dict) -> None:
        if "dro_q" in state:
            self.q.copy_(state["dro_q"])
