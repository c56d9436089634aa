"""MINE: the statistics network T(z, c) and the Donsker-Varadhan bound on I(Z; C).

L_ne = E_joint[T(z, c)] - log E_marg[exp T(z, c~)], c~ = c shuffled inside the batch
(Belghazi et al., 2018), in nats. The plain DV gradient is biased on mini-batches (the log of
a mean is not the mean of a log); `MINE(ema_rate=...)` enables MINE's moving-average fix.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from unbiased.graphs import GraphedStep, graph_obstacles


class StatisticsNetwork(nn.Module):
    """T_phi([z, c]): an MLP with leaky-ReLU(0.2) hidden layers. The default is the paper's
    3-layer T for digits; German uses `hidden_layers=1` (the paper's "shallow" T).

    `standardize` (ours): g cannot escape T by rescaling z (a drift of z's scale let the
    theta step fool T on full MNIST; docs/MEASURED.md).
    """

    def __init__(self, z_dim: int, c_dim: int, hidden: int = 64, hidden_layers: int = 2,
                 standardize: bool = False):
        super().__init__()
        self.standardize = standardize
        layers: list[nn.Module] = []
        width = z_dim + c_dim
        for _ in range(hidden_layers):
            layers += [nn.Linear(width, hidden), nn.LeakyReLU(0.2)]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if self.standardize:
            z = standardized(z)
        return self.net(torch.cat([z, c], dim=1)).squeeze(1)


def standardized(z: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    var, mean = torch.var_mean(z, dim=0, correction=0, keepdim=True)
    return (z - mean) * torch.rsqrt(var + eps)


def shuffled_within(c: torch.Tensor, groups: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """c permuted within groups (labels y): with z, samples of p(z, y) p(c | y)."""
    return c[permutation_within(groups, generator, c.device)]


def permutation_within(groups: torch.Tensor, generator: torch.Generator | None,
                       device: torch.device) -> torch.Tensor:
    where = generator.device if generator is not None else torch.device("cpu")
    n = len(groups)
    # Two random orders that both list the rows grouped by label: position i holds a row of
    # the same group in each, so row order_a[i] takes the c of row order_b[i].
    keys = [groups.to(where).double() + torch.rand(n, generator=generator, device=where,
                                                   dtype=torch.float64) * 0.5
            for _ in range(2)]
    order_a, order_b = (k.argsort().to(device) for k in keys)
    perm = torch.empty_like(order_a)
    perm[order_a] = order_b
    return perm


def permutation(n: int, generator: torch.Generator | None, device: torch.device
                ) -> torch.Tensor:
    """Drawn on the generator's own device: no host-to-device copy, no sync per step."""
    where = generator.device if generator is not None else torch.device("cpu")
    return torch.randperm(n, generator=generator, device=where).to(device)


def dv_bound(t_joint: torch.Tensor, t_marg: torch.Tensor, w_joint: torch.Tensor | None = None,
             w_marg: torch.Tensor | None = None) -> torch.Tensor:
    """mean(T_joint) - log mean(exp T_marg), both means weighted by any weights."""
    if w_joint is None:
        return t_joint.mean() - log_mean_exp(t_marg)
    return (w_joint * t_joint).sum() / w_joint.sum() - log_mean_exp(t_marg, w_marg)


def log_mean_exp(t: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    if weights is None:
        return torch.logsumexp(t, dim=0) - math.log(t.shape[0])
    return torch.logsumexp(t + weights.log(), dim=0) - weights.sum().log()


class MINE(nn.Module):
    """A statistics network plus the estimator's objective. `phi_loss` is -L_ne, or with
    `ema_rate` the surrogate whose gradient is
    grad E[T_joint] - grad E[exp T_marg] / moving_average(E[exp T_marg])."""

    def __init__(self, z_dim: int, c_dim: int, hidden: int = 64, hidden_layers: int = 2,
                 ema_rate: float | None = None, standardize: bool = False):
        super().__init__()
        if ema_rate is not None and not 0.0 < ema_rate <= 1.0:
            raise ValueError(f"ema_rate must be in (0, 1], got {ema_rate}")
        self.T = StatisticsNetwork(z_dim, c_dim, hidden, hidden_layers, standardize)
        self.ema_rate = ema_rate
        # Moving average of log E[exp T_marg], kept in log space so it cannot overflow.
        self.register_buffer("log_ema", torch.tensor(float("nan")))

    def scores(self, z: torch.Tensor, c: torch.Tensor,
               generator: torch.Generator | None = None, c_marg: torch.Tensor | None = None,
               weights: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """T on the joint and the marginal rows; with `weights`, the marginal pairs' too."""
        # One pass of T over both stacked: the K inner steps are dominated by per-call
        # overhead.
        n = c.shape[0]
        w_marg = None
        if c_marg is None:
            perm = permutation(n, generator, c.device)
            c_marg = c[perm]
            w_marg = None if weights is None else weights * weights[perm]
        t = self.T(torch.cat([z, z]), torch.cat([c, c_marg]))
        return t[:n], t[n:], w_marg

    def lower_bound(self, z: torch.Tensor, c: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        t_joint, t_marg, _ = self.scores(z, c, generator)
        return dv_bound(t_joint, t_marg)

    def phi_loss(self, z: torch.Tensor, c: torch.Tensor,
                 generator: torch.Generator | None = None, c_marg: torch.Tensor | None = None,
                 weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        t_joint, t_marg, w_marg = self.scores(z, c, generator, c_marg, weights)
        estimate = dv_bound(t_joint, t_marg, weights, w_marg)
        if self.ema_rate is None:
            return -estimate, estimate.detach()
        marg_lme = log_mean_exp(t_marg, w_marg)
        joint_mean = (t_joint.mean() if weights is None
                      else (weights * t_joint).sum() / weights.sum())
        with torch.no_grad():
            rate = self.ema_rate
            if rate == 1.0:
                self.log_ema.copy_(marg_lme)
            else:
                # The first step (log_ema still NaN) starts the average; chosen on the device,
                # as `if isnan` would make the host wait for it at each of the K inner steps.
                moved = torch.logaddexp(self.log_ema + math.log1p(-rate),
                                        marg_lme + math.log(rate))
                self.log_ema.copy_(torch.where(torch.isnan(self.log_ema), marg_lme, moved))
        # d/dphi of exp(lme - log_ema) = grad E[exp T] / ema: the corrected denominator.
        surrogate = joint_mean - torch.exp(marg_lme - self.log_ema.detach())
        return -surrogate, estimate.detach()


@torch.no_grad()
def estimate_mi(mine: MINE, z: torch.Tensor, c: torch.Tensor, batch_size: int | None = None,
                shuffles: int = 1, generator: torch.Generator | None = None,
                given: torch.Tensor | None = None, weights: torch.Tensor | None = None
                ) -> float:
    """DV estimate over a whole set with the current T. With `batch_size`, the mean over
    random batches, the statistic training sees: DV over one huge batch is dominated by the
    few largest exp(T) on shuffled pairs, so far noisier."""
    was_training = mine.training
    mine.eval()
    size = len(z) if batch_size is None else max(2, batch_size)
    values, sizes = [], []
    for _ in range(shuffles):
        perm = permutation(len(z), generator, z.device)
        z, c = z[perm], c[perm]
        given = None if given is None else given[perm]
        weights = None if weights is None else weights[perm]
        for i in range(0, len(z), size):
            zb, cb = z[i:i + size], c[i:i + size]
            if len(zb) < 2:
                continue
            pairs = (permutation(len(cb), generator, cb.device) if given is None
                     else permutation_within(given[i:i + size], generator, cb.device))
            wb = None if weights is None else weights[i:i + size]
            values.append(float(dv_bound(mine.T(zb, cb), mine.T(zb, cb[pairs]), wb,
                                         None if wb is None else wb * wb[pairs])))
            sizes.append(len(zb) if wb is None else float(wb.sum()))
    mine.train(was_training)
    return sum(v * w for v, w in zip(values, sizes, strict=True)) / sum(sizes)


def mi_eval(z: torch.Tensor, c: torch.Tensor, seed: int = 0, steps: int = 2000,
            batch_size: int = 512, lr: float = 1e-3, hidden: int = 64, hidden_layers: int = 2,
            holdout: float = 0.2, given: torch.Tensor | None = None,
            cuda_graphs: bool = False, weights: torch.Tensor | None = None) -> float:
    """MI of frozen features z with c, judged by a fresh T fitted on (1 - holdout) of the
    rows and read on the rest, so T memorising its rows does not inflate it.

    With `given` (labels y): a lower bound on I(z; c | y). A z that encodes y alone scores ~0
    on it, but about I(y; c) on the plain bound (~1.9 nats on Colored MNIST at sigma 0.03).
    With `weights`, the MI under the distribution they weigh the rows by (docs/METRICS.md,
    "Balanced MI").
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
