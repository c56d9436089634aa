"""lntl: Kim et al. (CVPR 2019), "Learning Not to Learn", as their code trains it
(feidfoe/learning-not-to-learn, `trainer.py`, `_train_step`).

One bias head per bias group (Colored MNIST: one per RGB channel, 8 classes each; our 24-d c
is read as three 8-way targets) predicts the bias from z. Per mini-batch, two updates:
1. g and f descend L_task + lam * (mean over heads of the batch-mean negative entropy
   sum_k p_k log p_k of the head's softmax): g makes the heads *uncertain*, not wrong. The
   heads do not move in this step.
2. A second forward of the same batch: the heads descend their summed bias cross-entropy,
   and its gradient reaches g through a gradient reversal scaled by mu (g then works against
   what the heads can predict).
At lam = 0 the method is off whatever mu (as every method here at lam = 0, so the sweeps' one
ERM trial per (sigma, seed) is the same under any method): g and f take plain ERM steps and
the heads still learn, on detached z. mu = 0 with lam > 0 keeps the entropy term alone.

Where we differ from their code, and why:
- Optimiser: Adam at the shared lr for g and f, Adam at head_lr (default lr) for the heads,
  as every method here, for a like-for-like comparison; theirs is SGD (lr 0.01, momentum 0.9,
  weight decay 5e-4) with a step decay, for every network.
- The heads read z (the representation every method here debiases), not the conv feature
  map of their network; each is the same small MLP as the other methods' bias head
  (`head_hidden` units, 0 = linear). Their lambda (0.01) and reversal scale (0.1) are
  constants in the code; here they are `lam` and `mu`.
- Without a reversal (lam = 0 or mu = 0) step 2 trains the heads on step 1's z, detached,
  with no second forward: a zero-gradient Adam step would still move g.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import Benchmark, Split, bias_targets
from unbiased.methods.base import ERM, BiasHead
from unbiased.methods.grad_reversal import BiasHeadConfig, reverse_gradient
from unbiased.settings import setting

# Kim et al.'s reversal scale (trainer.py's GradReverse); their entropy weight, 0.01, is our
# `lam` and comes from the sweep's lambda grid like every method's.
KIM_MU = 0.1


@dataclass
class LNTLConfig(BiasHeadConfig):
    """`lam` weighs the heads' negative entropy in g's loss; `mu` scales the reversed bias
    cross-entropy that reaches g from the heads' own update (only when lam > 0)."""

    mu: float = setting(
        KIM_MU, "lntl: scale of the bias heads' gradient reversed into g (Kim et al.'s 0.1)",
        ge=0)


def negative_entropy(logits: list[torch.Tensor]) -> torch.Tensor:
    """Mean over heads of the batch mean of sum_k p_k log p_k (its minimum, -log #classes,
    is a uniform prediction)."""
    return torch.stack([(F.softmax(lg, dim=1) * F.log_softmax(lg, dim=1)).sum(1).mean()
                        for lg in logits]).mean()


class LNTL(ERM):
    """penalty: the heads' mean negative entropy on the batch (lower = z tells the heads
    less; -log 8 = -2.079 on Colored MNIST is a uniform prediction)."""

    name = "lntl"
    Config = LNTLConfig
    cfg: LNTLConfig

    def __init__(self, bench: Benchmark, cfg: LNTLConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        with self.own_init():
            self.heads = nn.ModuleList(
                BiasHead(bench.z_dim, (k,), cfg.head_hidden) for k in bench.bias_classes
            ).to(self.device)
        self.head_opt = torch.optim.Adam(self.heads.parameters(), lr=cfg.head_lr or cfg.lr,
                                         fused=self.fused)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "heads": self.heads}

    def head_logits(self, z: torch.Tensor) -> list[torch.Tensor]:
        return [head(z)[0] for head in self.heads]

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(x)
        loss_task = F.cross_entropy(self.f(z), y)
        # 1. g and f: task + lam * negative entropy (heads fixed: their gradients are dropped
        #    by the zero_grad of step 2).
        loss_task, penalty = self.task_step(loss_task, lambda detach: negative_entropy(
            self.head_logits(z.detach() if detach else z)))
        # 2. the heads on the bias, reversed into g (scaled by mu).
        targets = bias_targets(c, self.bench.bias_classes)
        reverse = self.cfg.lam > 0 and self.cfg.mu > 0
        if reverse:
            z_head = reverse_gradient(self._features(x), self.cfg.mu)
        else:
            z_head = z.detach()
        loss_bias = torch.stack([F.cross_entropy(lg, targets[:, i]) for i, lg in
                                 enumerate(self.head_logits(z_head))]).sum()
        self.model_opt.zero_grad(set_to_none=True)
        self.head_opt.zero_grad(set_to_none=True)
        loss_bias.backward()
        if reverse:
            self.model_opt.step()
        self.head_opt.step()
        return loss_task, penalty

    def extra_state(self) -> dict:
        return {"heads": self.heads.state_dict(), "head_opt": self.head_opt.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.heads.load_state_dict(state["heads"])
        self.head_opt.load_state_dict(state["head_opt"])
