"""hsic: a non-adversarial independence penalty, lam * HSIC(z, c) on every mini-batch (as
ReBias, Bahng et al., ICML 2020, uses HSIC).

HSIC is the biased estimator tr(K H L H) / (n - 1)^2 with a Gaussian kernel on z (bandwidth:
the batch's median pairwise distance, or `hsic_bandwidth`) and a linear kernel on c.

The median bandwidth is part of the graph, so the penalty is scale-free. With the median
detached, at lam >= 1 z shrank to a point within one epoch: median pairwise distance 18 ->
0.0004, training at chance (docs/MEASURED.md). A fixed `hsic_bandwidth` avoids that, but z
then grows until the kernel is nearly diagonal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from unbiased.data import Split
from unbiased.methods.base import ERM, TrainConfig
from unbiased.search import LogUniform
from unbiased.settings import setting


@dataclass
class HSICConfig(TrainConfig):
    reads_map_z: ClassVar[bool] = False

    hsic_bandwidth: float | None = setting(
        None, "hsic: Gaussian kernel width on z (default: the batch's median pairwise "
              "distance)", gt=0)


def hsic(z: torch.Tensor, c: torch.Tensor, bandwidth: float | None = None) -> torch.Tensor:
    """Biased HSIC of a batch: Gaussian kernel on z, linear kernel on c."""
    n = z.shape[0]
    d2 = torch.cdist(z, z).pow(2)
    if bandwidth is None:
        # The off-diagonal entries in row order, as a view: a boolean mask would make the
        # host wait for the device every step to learn its size.
        off = d2.flatten()[1:].view(n - 1, n + 1)[:, :-1]
        width2 = off.median().clamp_min(1e-12)  # differentiated: see the module docstring
    else:
        width2 = torch.tensor(bandwidth ** 2, device=z.device)
    k = torch.exp(-d2 / (2 * width2))
    lin = c @ c.T
    k_centred = k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()
    return (k_centred * lin).sum() / (n - 1) ** 2  # tr(K H L H) = sum(HKH * L)


class HSIC(ERM):
    """penalty: the batch HSIC(z, c)."""

    name = "hsic"
    search = {"lam": LogUniform(0.1, 10.0)}
    Config = HSICConfig
    cfg: HSICConfig

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(x)
        loss_task = F.cross_entropy(self.f(z), y)
        return self.task_step(loss_task, lambda detach: hsic(z.detach() if detach else z, c,
                                                             self.cfg.hsic_bandwidth))
