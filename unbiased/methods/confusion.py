"""confusion: Alvi et al. (ECCV Workshops 2018), "Turning a Blind Eye".

Alternating per mini-batch: (1) a bias head h is trained on CE(h(z), c), z detached; (2) g
and f take one step on L_task + lam * CE(h(z), uniform), minimal when h cannot tell the bias
classes apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from unbiased.data import Split
from unbiased.methods.grad_reversal import BiasHeadConfig, HeadMethod
from unbiased.search import LogUniform


def confusion_loss(logits: list[torch.Tensor]) -> torch.Tensor:
    """Mean over heads of CE(softmax(logits), uniform) = -mean over classes of log p."""
    return torch.stack([-F.log_softmax(lg, dim=1).mean(dim=1).mean()
                        for lg in logits]).mean()


class Confusion(HeadMethod):
    """penalty: the confusion loss of step (2) (its minimum, log #classes, = fully confused)."""

    name = "confusion"
    search = {"lam": LogUniform(0.1, 10.0)}
    Config = BiasHeadConfig

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(x)
        self.head_step(z.detach(), c)
        loss_task = F.cross_entropy(self.f(z), y)
        # The head's own gradients from this term are discarded: head_step zeroes them.
        return self.task_step(loss_task, lambda detach: confusion_loss(
            self.head(z.detach() if detach else z)))
