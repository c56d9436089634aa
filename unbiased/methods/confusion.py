"""confusion: Alvi et al. (ECCV Workshops 2018), "Turning a Blind Eye".

Alternating per mini-batch: (1) a bias head h is trained on the cross-entropy of h(z) with
the bias classes c, z detached; (2) g and f take one step on
L_task + lam * CE(h(z), uniform), the cross-entropy between the (fixed) head's prediction and
the uniform distribution over the bias classes, minimal when h cannot tell the classes apart.
lam weighs that confusion loss against the task loss; at lam = 0 g and f are plain ERM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from unbiased.data import Split
from unbiased.methods.base import bias_cross_entropy
from unbiased.methods.grad_reversal import BiasHeadConfig, HeadMethod


def confusion_loss(logits: list[torch.Tensor]) -> torch.Tensor:
    """Mean over heads of CE(softmax(logits), uniform) = -mean over classes of log p."""
    return torch.stack([-F.log_softmax(lg, dim=1).mean(dim=1).mean()
                        for lg in logits]).mean()


class Confusion(HeadMethod):
    """penalty: the confusion loss of step (2) (its minimum, log #classes, = fully confused)."""

    name = "confusion"
    Config = BiasHeadConfig

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(x)
        head_loss = bias_cross_entropy(self.head(z.detach()), self.targets(c))
        self.head_opt.zero_grad(set_to_none=True)
        head_loss.backward()
        self.head_opt.step()
        loss_task = F.cross_entropy(self.f(z), y)
        self.model_opt.zero_grad(set_to_none=True)
        if self.cfg.lam == 0:
            loss_task.backward()
            self.model_opt.step()
            with torch.no_grad():
                return loss_task.detach(), confusion_loss(self.head(z.detach()))
        # Only g's gradient of the confusion term is used: the head is not stepped here.
        self.head.requires_grad_(False)
        try:
            penalty = confusion_loss(self.head(z))
            (loss_task + self.cfg.lam * penalty).backward()
        finally:
            self.head.requires_grad_(True)
        self.model_opt.step()
        return loss_task.detach(), penalty.detach()
