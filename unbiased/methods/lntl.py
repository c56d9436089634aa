"""lntl: Kim et al. (CVPR 2019), "Learning Not to Learn", as their code trains it
(feidfoe/learning-not-to-learn, `trainer.py`, `_train_step`).

Bias heads (Colored MNIST: one per RGB channel) predict the bias from z. Per mini-batch:
1. g and f descend L_task + lam * (the heads' mean negative entropy): g makes the heads
   *uncertain*, not wrong. The heads do not move in this step.
2. A second forward of the same batch: the heads descend their summed bias cross-entropy,
   whose gradient reaches g through a gradient reversal scaled by mu.
`lntl_heads map` is Kim et al.'s: per pixel of a feature-map z, each head predicts its input
channel's value bin there (models.py:47-65, data_loader.py:44-52 of their code).

Where we differ from their code, and why:
- By default Adam and heads on z, as every method here, for a like-for-like comparison;
  `--optimizer sgd`, `lntl_heads map` and the `kim` preset run theirs.
- Their three map heads are one module (grouped conv): BN is per channel and each group
  sees its own head's channels only, so it computes exactly their three heads.
- Without a reversal (lam = 0 or mu = 0) step 2 trains the heads on step 1's z, detached,
  with no second forward: a zero-gradient Adam step would still move g.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import Split
from unbiased.methods.base import BiasHead
from unbiased.methods.grad_reversal import BiasHeadConfig, HeadMethod, reverse_gradient
from unbiased.models import map_channels, uint8_levels
from unbiased.search import LogUniform
from unbiased.settings import setting

# Kim et al.'s reversal scale (trainer.py's GradReverse).
KIM_MU = 0.1
LNTL_HEADS: tuple[str, ...] = ("z", "map")
# A pixel whose target is this is left out of the heads' losses (F.cross_entropy's default).
IGNORED = -100


@dataclass
class LNTLConfig(BiasHeadConfig):
    reads_map_z: ClassVar[bool] = True

    mu: float = setting(
        KIM_MU, "lntl: scale of the bias heads' gradient reversed into g (Kim et al.'s 0.1)",
        ge=0)
    lntl_heads: str = setting(
        "z", "lntl: the bias heads read z (an MLP per bias group, the bias from c), or map: "
             "Kim et al.'s heads on a feature-map z (--model kim_convnet), per pixel, each "
             "predicting its input channel's value bin there", choices=LNTL_HEADS)

    def problems(self) -> list[str]:
        problems = super().problems()
        map_z = map_channels(self.model) > 0
        if self.lntl_heads == "map" and not map_z:
            problems.append(f"lntl_heads 'map' needs a model whose z is a feature map "
                            f"(kim_convnet), got model {self.model!r}")
        if map_z and self.lntl_heads != "map":
            problems.append(f"model {self.model!r} gives a feature-map z: lntl reads it with "
                            f"lntl_heads 'map', got {self.lntl_heads!r}")
        return problems


class PixelHeads(nn.Module):
    """Kim et al.'s colour heads (one `Predictor` per input channel) as one module."""

    def __init__(self, in_channels: int, heads: int, classes: int):
        super().__init__()
        self.classes = classes
        self.conv1 = nn.Conv2d(in_channels, heads * in_channels, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(heads * in_channels)
        self.conv2 = nn.Conv2d(heads * in_channels, heads * classes, kernel_size=3, padding=1,
                               groups=heads)

    def forward(self, z: torch.Tensor) -> list[torch.Tensor]:
        return list(self.conv2(F.relu(self.bn1(self.conv1(z)))).split(self.classes, dim=1))


def pixel_targets(x: torch.Tensor, bins: int, size: tuple[int, int]) -> torch.Tensor:
    """Targets as Kim et al.'s data_loader.py:44-52 makes them: PIL's NEAREST resize is
    torch's "nearest-exact"; IGNORED where the channel is 0 (black background)."""
    small = F.interpolate(uint8_levels(x.float()), size=tuple(size), mode="nearest-exact")
    binned = torch.div(small, 256 // bins, rounding_mode="floor").long()
    return binned.masked_fill_(small == 0, IGNORED)


def negative_entropy(logits: list[torch.Tensor]) -> torch.Tensor:
    """Mean over heads and predictions of sum_k p_k log p_k."""
    return torch.stack([(F.softmax(lg, dim=1) * F.log_softmax(lg, dim=1)).sum(1).mean()
                        for lg in logits]).mean()


class LNTL(HeadMethod):
    """penalty: the heads' mean negative entropy (-log 8 = -2.079: uniform)."""

    name = "lntl"
    search = {"lam": LogUniform(1e-3, 1.0)}  # the entropy term's scale: Kim et al.'s 0.01
    Config = LNTLConfig
    cfg: LNTLConfig
    head_key = "heads"

    def make_head(self) -> nn.Module:
        classes = self.bench.bias_classes
        if self.cfg.lntl_heads == "map":
            if len(set(classes)) != 1:
                raise ValueError(f"lntl_heads 'map' needs as many bins for every input "
                                 f"channel, got bias classes {classes}")
            return PixelHeads(map_channels(self.cfg.model), len(classes), classes[0])
        return nn.ModuleList(BiasHead(self.bench.z_dim, (k,), self.cfg.head_hidden)
                             for k in classes)

    def head_logits(self, z: torch.Tensor) -> list[torch.Tensor]:
        if isinstance(self.head, PixelHeads):
            return self.head(z)
        return [head(z)[0] for head in self.head]

    def head_targets(self, x: torch.Tensor, c: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if isinstance(self.head, PixelHeads):
            return pixel_targets(x, self.bench.bias_classes[0], z.shape[-2:])
        return self.targets(c)

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(x)
        loss_task = F.cross_entropy(self.f(z), y)
        # 1. g and f: task + lam * negative entropy (heads fixed: their gradients are dropped
        #    by the zero_grad of step 2).
        loss_task, penalty = self.task_step(loss_task, lambda detach: negative_entropy(
            self.head_logits(z.detach() if detach else z)))
        # 2. the heads on the bias, reversed into g (scaled by mu).
        targets = self.head_targets(x, c, z)
        reverse = self.cfg.lam > 0 and self.cfg.mu > 0
        z_head = reverse_gradient(self._features(x), self.cfg.mu) if reverse else z.detach()
        loss_bias = torch.stack([F.cross_entropy(lg, targets[:, i]) for i, lg in
                                 enumerate(self.head_logits(z_head))]).sum()
        self.model_opt.zero_grad(set_to_none=True)
        self.head_opt.zero_grad(set_to_none=True)
        loss_bias.backward()
        if reverse:
            self.model_opt.step()
        self.head_opt.step()
        return loss_task, penalty
