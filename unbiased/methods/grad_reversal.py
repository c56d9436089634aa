"""grad_reversal: an adversarial bias head through a gradient reversal layer (Ganin &
Lempitsky, ICML 2015; the spirit of Kim et al., CVPR 2019, "Learning Not to Learn").

A head h on z is trained on its bias cross-entropy; the same backward sends it to g reversed
and scaled by lam, so g descends L_task - lam * CE(h(z), c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import Benchmark, Split, bias_targets
from unbiased.methods.base import ERM, BiasHead, TrainConfig, bias_cross_entropy
from unbiased.search import LogUniform
from unbiased.settings import setting


@dataclass
class BiasHeadConfig(TrainConfig):
    reads_map_z: ClassVar[bool] = False

    head_hidden: int = setting(
        64, "grad_reversal, confusion, lntl: hidden units of the bias head (0 = linear)", ge=0)
    head_lr: float | None = setting(
        None, "grad_reversal, confusion, lntl: Adam learning rate of the bias head (default: "
              "--lr)", gt=0)


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return z.view_as(z)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.scale * grad, None


def reverse_gradient(z: torch.Tensor, scale: float) -> torch.Tensor:
    return _Reverse.apply(z, scale)


class HeadMethod(ERM):
    """A bias head on z and its optimiser; `head_key` names it among the modules and in a
    checkpoint."""

    cfg: BiasHeadConfig
    head_key: ClassVar[str] = "head"

    def __init__(self, bench: Benchmark, cfg: BiasHeadConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        with self.own_init():
            self.head = self.make_head().to(self.device)
        self.head_opt = self.optimizer(list(self.head.parameters()), cfg.head_lr or cfg.lr)

    def make_head(self) -> nn.Module:
        return BiasHead(self.bench.z_dim, self.bench.bias_classes, self.cfg.head_hidden)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), self.head_key: self.head}

    def adversary_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.head_opt]

    def targets(self, c: torch.Tensor) -> torch.Tensor:
        return bias_targets(c, self.bench.bias_classes)

    def head_step(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        loss = bias_cross_entropy(self.head(z), self.targets(c))
        self.head_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.head_opt.step()
        return loss.detach()

    def extra_state(self) -> dict:
        return {self.head_key: self.head.state_dict(), "head_opt": self.head_opt.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.head.load_state_dict(state[self.head_key])
        self.head_opt.load_state_dict(state["head_opt"])


class GradReversal(HeadMethod):
    """penalty: the head's bias cross-entropy (higher = z tells less about c)."""

    name = "grad_reversal"
    search = {"lam": LogUniform(0.1, 10.0)}
    Config = BiasHeadConfig

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(x)
        loss_task = F.cross_entropy(self.f(z), y)
        z_head = z.detach() if self.cfg.lam == 0 else reverse_gradient(z, self.cfg.lam)
        loss_bias = bias_cross_entropy(self.head(z_head), self.targets(c))
        self.model_opt.zero_grad(set_to_none=True)
        self.head_opt.zero_grad(set_to_none=True)
        (loss_task + loss_bias).backward()
        self.model_opt.step()
        self.head_opt.step()
        return loss_task.detach(), loss_bias.detach()
