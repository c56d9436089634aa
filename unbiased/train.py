"""The training loop's public names, and `mi_eval`: MI of frozen features judged by a fresh
statistics network, the measure every method is compared by.

Algorithm 1 of the paper is the `mi_backprop` method (unbiased/methods/mi_backprop.py);
`Algorithm1` and `LoopConfig` are its names here, used by bench/ and the tests.
"""

from __future__ import annotations

import torch
from torch import nn

from unbiased.graphs import GraphedStep, graph_obstacles
from unbiased.methods.base import EpochStats
from unbiased.methods.mi_backprop import (
    INNER_Z_MODES,
    MINE_OPTIMIZERS,
    THETA_UPDATES,
    combine_grads,
    rescaled_mi_grad,
)
from unbiased.methods.mi_backprop import MIBackprop as Algorithm1
from unbiased.methods.mi_backprop import MIBackpropConfig as LoopConfig
from unbiased.mine import MINE, estimate_mi, shuffled_within

__all__ = ["Algorithm1", "LoopConfig", "EpochStats", "INNER_Z_MODES", "MINE_OPTIMIZERS",
           "THETA_UPDATES", "combine_grads", "rescaled_mi_grad", "mi_eval", "count_parameters"]


def mi_eval(z: torch.Tensor, c: torch.Tensor, seed: int = 0, steps: int = 2000,
            batch_size: int = 512, lr: float = 1e-3, hidden: int = 64, hidden_layers: int = 2,
            holdout: float = 0.2, given: torch.Tensor | None = None,
            cuda_graphs: bool = False, weights: torch.Tensor | None = None) -> float:
    """MI of frozen features z with c, judged by a statistics network the model never saw.

    A fresh T is trained on (1 - holdout) of the rows and the DV bound is reported on the held
    out rows, so the number is not inflated by T memorising the rows it was trained on.
    With `given` (labels y), the marginal rows shuffle c only among rows of the same label:
    a lower bound on I(z; c | y), the colour z carries beyond what its label explains. A model
    whose z encodes y alone scores ~0 on it, but about I(y; c) on the plain bound (~1.9 nats
    on Colored MNIST at sigma 0.03, where colour nearly fixes the class).
    With `cuda_graphs` on a GPU the critic's step is captured once and replayed (the same
    draws; unbiased/graphs.py): thousands of steps of ~60 small kernels each.
    With the rows' `weights` (`balanced_weights`: every (y, c) group the same weight), the
    MI under the distribution they weigh the rows by: T is fitted on batches drawn with
    probability proportional to the weights, and the held-out bound is the weighted one
    (docs/METRICS.md, "Balanced MI").
    """
    z = z.flatten(1)  # a feature-map z (N, C, H, W): one vector a row
    gen = torch.Generator(device=z.device).manual_seed(seed)  # on z's device: no copies
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mine = MINE(z.shape[1], c.shape[1], hidden, hidden_layers).to(z.device)
    perm = torch.randperm(len(z), generator=gen, device=z.device)
    n_hold = max(2, int(len(z) * holdout))
    hold, fit = perm[:n_hold], perm[n_hold:]
    z_fit, c_fit = z[fit], c[fit]
    given_fit = None if given is None else given[fit]
    w_fit = None if weights is None else weights[fit].double()
    # A multinomial draw is not captured: weighted fits run eager.
    graphed = cuda_graphs and weights is None and not graph_obstacles(z.device, {})
    opt = torch.optim.Adam(mine.parameters(), lr=lr, fused=z.device.type in ("cpu", "cuda"),
                           capturable=graphed)
    bs = min(batch_size, len(fit))

    def step() -> tuple[torch.Tensor, ...]:
        idx = (torch.randint(len(fit), (bs,), generator=gen, device=z.device) if w_fit is None
               else torch.multinomial(w_fit, bs, replacement=True, generator=gen))
        c_marg = None if given_fit is None else shuffled_within(c_fit[idx], given_fit[idx],
                                                                 gen)
        loss, _ = mine.phi_loss(z_fit[idx], c_fit[idx], gen, c_marg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return (loss.detach(),)
    run = GraphedStep(step, [gen]) if graphed else step
    for _ in range(steps):
        run()
    return estimate_mi(mine, z[hold], c[hold], batch_size=None, shuffles=8, generator=gen,
                       given=None if given is None else given[hold],
                       weights=None if weights is None else weights[hold])


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
