"""mi_backprop: Algorithm 1 of the paper (Ragonesi et al., CVPR Workshops 2021).

Per outer step: K gradient-ascent steps on phi (MINE's T) for L_ne = DV bound of I(z; c) in
nats, then one step of theta (g) on L_task + lam * L_ne and of psi (f) on L_task. At lam = 0
MINE still trains alongside ERM, so every model's MI is measured the same way (Fig. 3).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import Benchmark, GroupSampler, Split, balanced_weights
from unbiased.graphs import GraphedStep, graph_obstacles
from unbiased.methods.base import ERM, EpochStats, TrainConfig, rows_of
from unbiased.mine import MINE, estimate_mi, permutation
from unbiased.search import LogUniform
from unbiased.settings import setting

INNER_Z_MODES: tuple[str, ...] = ("fresh", "batch", "bank", "first_k")
MI_WEIGHTS: tuple[str, ...] = ("none", "groups")
MINE_OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")
THETA_UPDATES: tuple[str, ...] = ("separate", "joint")


@dataclass
class MIBackpropConfig(TrainConfig):
    reads_map_z: ClassVar[bool] = False

    K: int = setting(80, "MINE steps per model step", ge=1, axis=True)
    mine_lr: float = setting(1e-4, "learning rate of the statistics network", gt=0)
    mine_optimizer: str = setting("adam", "optimiser of MINE", choices=MINE_OPTIMIZERS)
    # Theta is fixed during the K steps, so with bank_refresh = 1 "bank" equals "fresh".
    # "first_k" fits T mostly on rows other than the theta batch it scores.
    inner_z: str = setting(
        "fresh", "z of the K inner MINE steps: fresh mini-batches through g (Algorithm 1), "
                 "the current batch's z reused, mini-batches from a bank of training-set z "
                 "recomputed every --bank-refresh steps (cheap, but a stale bank let the "
                 "model fool MINE on digits: see bench/RESULTS.md, section 2), or the "
                 "authors' digit_trainer.py (first_k: a MINE pass over each epoch, then K "
                 "steps on fresh forwards of the epoch's first K batches after every theta "
                 "step)", choices=INNER_Z_MODES)
    bank_refresh: int = setting(
        10, "outer steps between recomputations of the z bank (--inner-z bank)", ge=1)
    # A pool drawn anew at each refresh costs N forwards instead of len(train).
    bank_size: int | None = setting(
        None, "z bank of a random pool of this many training rows instead of the whole set "
              "(--inner-z bank)", ge=2)
    # The authors' code does this so the unbounded MI term cannot swamp the task gradient.
    rescale_mi_grad: bool = setting(
        True, "scale theta's MI gradient per tensor to norm min(|g_task|, |g_MI|)")
    # "separate": the MI gradient's own Adam moments keep the penalty's step size however
    # small its gradient gets. "joint": the rescaled MI part can never outgrow the task
    # gradient, which shrinks as the task is fitted.
    theta_update: str = setting(
        "separate", "separate: the task gradient through Adam(lr) and the rescaled MI "
                    "gradient through a second Adam(lr * lam), as the authors' code; joint: "
                    "one Adam step on their sum (fades on full MNIST, docs/MEASURED.md)",
        choices=THETA_UPDATES)
    # A value decouples the MI step from the task's lr (a fast schedule, a gentle penalty).
    mi_lr: float | None = setting(
        None, "theta's MI Adam learning rate under --theta-update separate (default: --lr x "
              "lam, the authors')", gt=0)
    mine_ema_rate: float | None = setting(
        None, "MINE's bias-corrected gradient: moving-average rate of E[exp T] (0 = the plain "
              "DV gradient)", ge=0, le=1)
    mine_hidden: int = setting(64, "hidden units per layer of the statistics network T", ge=1)
    mine_hidden_layers: int = setting(2, "hidden layers of the statistics network T", ge=1)
    # `mi_guard`: T worse than a constant says nothing about colour (on full MNIST a run of
    # such steps let the own estimate run away to -768).
    mine_standardize: bool = setting(
        False, "ours: T reads z standardised per dimension by the statistics of the rows it "
               "scores, so rescaling z cannot carry it out of T's reach")
    mi_guard: bool = setting(
        False, "ours: no MI step of theta on a batch whose DV estimate is below 0 (T worse "
               "than a constant); reports guarded_frac each epoch")
    # Where c is nearly a function of y (Biased MNIST) the plain penalty removes the label;
    # group-balanced, c is independent of y (docs/METRICS.md, "Balanced MI"). Weighting the
    # task's batches would not do: at rho .997 a batch of 128 holds 0.4 rare-group rows.
    mi_weights: str = setting(
        "none", "ours: groups = the critic and the penalty read I(z; c) on group-balanced "
                "batches (every (y, c) group of the benchmark in each, c independent of y) "
                "drawn beside the task's, and the trial's own mi is weighted so; none = "
                "the task's batches (--inner-z batch or fresh with groups)",
        choices=MI_WEIGHTS)
    # The outer step is ~5,000 kernels of a few microseconds each: eager, a GPU waits on
    # Python (docs/MEASURED.md, "CUDA graphs of the outer step").
    cuda_graphs: bool = setting(
        False, "capture the outer step (K critic steps and the theta/psi step) as a CUDA "
               "graph after 3 eager steps and replay it (GPU, --inner-z batch, constant lr; "
               "otherwise eager, said once in the trial's log); reports graphed each epoch")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.mi_weights != "none" and self.inner_z not in ("batch", "fresh"):
            problems.append(f"mi_weights {self.mi_weights!r} draws the critic's batches group "
                            f"by group: it needs inner_z 'batch' or 'fresh', got "
                            f"{self.inner_z!r}")
        return problems


def mi_backprop_graph_obstacles(cfg: MIBackpropConfig, device: torch.device) -> list[str]:
    return graph_obstacles(device, {
        f"--inner-z {cfg.inner_z} draws rows or runs passes of its own (graphs need "
        f"--inner-z batch)": cfg.inner_z != "batch",
        f"--lr-schedule {cfg.lr_schedule} changes the lr every step": (
            cfg.lr_schedule != "constant"),
        "--compile (a compiled module captures graphs of its own)": cfg.compile,
        "--mi-weights groups draws batches of its own": cfg.mi_weights != "none",
    })


class MIBackprop(ERM):
    name = "mi_backprop"
    search = {"lam": LogUniform(0.1, 10.0), "mine_lr": LogUniform(3e-4, 3e-3)}
    Config = MIBackpropConfig
    has_mi_estimator = True
    cfg: MIBackpropConfig

    def model_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.model_opt] + ([self.mi_opt] if self.mi_opt is not None else [])

    def adversary_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.mine_opt]

    def __init__(self, bench: Benchmark, cfg: MIBackpropConfig, seed: int,
                 device: torch.device | str = "cpu"):
        super().__init__(bench, cfg, seed, device)
        with self.own_init():
            self.mine = MINE(bench.z_dim, bench.c_dim, cfg.mine_hidden,
                             cfg.mine_hidden_layers, cfg.mine_ema_rate or None,
                             cfg.mine_standardize).to(self.device)
        self.mi_opt: torch.optim.Optimizer | None = None
        if cfg.theta_update == "separate" and cfg.lam > 0:
            mi_lr = cfg.mi_lr if cfg.mi_lr is not None else cfg.lr * cfg.lam
            self.mi_opt = self.optimizer(list(self.g.parameters()), mi_lr)
        mine_optimizer = torch.optim.Adam if cfg.mine_optimizer == "adam" else torch.optim.SGD
        self.mine_opt: torch.optim.Optimizer = mine_optimizer(
            self.mine.parameters(), lr=cfg.mine_lr, fused=self.fused)
        if cfg.compile:
            self.mine.T.compile()
        self.row_weight: torch.Tensor | None = None
        self.sampler: GroupSampler | None = None
        if cfg.mi_weights == "groups":
            groups, count = bench.train_groups()
            self.row_weight = balanced_weights(groups, count).to(self.device)
            self.sampler = GroupSampler(groups.to(self.device), count)
        self._bank: torch.Tensor | None = None
        self._bank_c: torch.Tensor | None = None
        self._bank_rows: torch.Tensor | None = None  # the pool's rows; None = the whole set
        self._bank_age = 0
        self._inner_pick: torch.Tensor | None = None  # rows of the last inner batch
        self._head: list[torch.Tensor] = []  # "first_k": rows of the epoch's first K batches
        # Theta steps of this epoch, and those mi_guard kept task-only (counted on the device).
        self.theta_steps = 0
        self._guarded = torch.zeros((), dtype=torch.int64, device=self.device)
        self.step_graph: GraphedStep | None = None
        if cfg.cuda_graphs:
            obstacles = mi_backprop_graph_obstacles(cfg, self.device)
            if obstacles:
                print(f"cuda graphs: off ({'; '.join(obstacles)}): this trial runs eager",
                      flush=True)
            else:
                self.step_graph = GraphedStep(self._batch_step, [self.method_gen])
            self._capturable(self.step_graph is not None)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "mine": self.mine}

    def _capturable(self, on: bool) -> None:
        # A captured optimiser step must keep its step count on the device (fused Adam does
        # already; torch asks for the flag). The values do not change.
        for opt in (self.model_opt, self.mi_opt, self.mine_opt):
            if opt is not None and "capturable" in opt.defaults:
                for group in opt.param_groups:
                    group["capturable"] = on

    def _indices(self, n: int, size: int) -> torch.Tensor:
        # Sampling with replacement: O(size) instead of a permutation of the whole set.
        return torch.randint(n, (size,), generator=self.method_gen,
                             device=self.method_gen.device).to(self.device)

    def _refresh_bank(self, train: Split) -> None:
        size, chunk = self.cfg.bank_size, self.cfg.eval_batch_size
        if size is None or size >= len(train):
            self._bank_rows, self._bank_c = None, train.c
            batches = train.batches(chunk)
        else:  # a pool: `size` distinct rows, drawn anew at each refresh
            self._bank_rows = permutation(len(train), self.method_gen, self.device)[:size]
            self._bank_c = train.c[self._bank_rows]
            batches = train.batches(chunk, self._bank_rows)
        with torch.no_grad():
            self._bank = torch.cat([self._features(x) for x, _, _ in batches])
        self._bank_age = 0

    def last_inner_rows(self) -> torch.Tensor | None:
        pick = self._inner_pick
        if self.cfg.inner_z == "bank" and pick is not None and self._bank_rows is not None:
            return self._bank_rows[pick]
        return pick

    def _inner_batches(self, train: Split, c_batch: torch.Tensor
                       ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        mode = self.cfg.inner_z
        if mode == "bank" and (self._bank is None or self._bank_age >= self.cfg.bank_refresh):
            self._refresh_bank(train)
        for _ in range(self.cfg.K):
            if mode == "bank":
                pick = self._indices(len(self._bank), len(c_batch))
                self._inner_pick = pick
                yield self._bank[pick], self._bank_c[pick]
                continue
            rows = (self._indices(len(train), len(c_batch)) if self.sampler is None
                    else self.sampler.batch(len(c_batch), self.method_gen))
            yield self._fresh_z(train, rows)

    def _fresh_z(self, train: Split, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._inner_pick = rows
        [(x, _, c)] = list(train.batches(len(rows), rows))
        with torch.no_grad():
            return self._features(x), c

    def _mine_step(self, z: torch.Tensor, c: torch.Tensor) -> None:
        loss, _ = self.mine.phi_loss(z, c, self.method_gen)
        self.mine_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.mine_opt.step()

    def _fresh_steps(self, train: Split, batches: list[torch.Tensor]) -> None:
        for rows in batches:
            self._mine_step(*self._fresh_z(train, rows))

    def start_epoch(self, order: torch.Tensor, train: Split) -> None:
        self.theta_steps = 0
        self._guarded.zero_()
        self._bank = None  # recomputed at the first step: a resumed run matches a straight one
        if self.cfg.inner_z == "first_k":
            bs = self.cfg.batch_size
            epoch = [order[i:i + bs] for i in range(0, len(order), bs)]
            epoch = [rows for rows in epoch if len(rows) >= 2]
            self._head = [epoch[q % len(epoch)] for q in range(self.cfg.K)]
            self._fresh_steps(train, epoch)  # the authors' MINE pass before the theta steps

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        self._inner_pick = rows
        if self.cfg.lam > 0:
            self.theta_steps += 1
        if self.step_graph is not None:
            return self.step_graph(x, y, c)
        if self.cfg.inner_z == "first_k":  # theta first, then T on the epoch's first K batches
            out = self._model_step(y, c, self._features(x))
            self._fresh_steps(train, self._head)
            return out
        balanced = None
        if self.sampler is not None:  # the critic's and the penalty's rows, group by group
            mi_rows = self.sampler.batch(len(rows), self.method_gen)
            [(x_mi, _, c_mi)] = list(train.batches(len(mi_rows), mi_rows))
            balanced = (x_mi, c_mi)
        if self.cfg.inner_z == "batch":
            return self._batch_step(x, y, c, balanced)
        for z_inner, c_inner in self._inner_batches(train, c):
            self._mine_step(z_inner, c_inner)
        self._bank_age += 1
        return self._model_step(y, c, self._features(x), balanced)

    def _batch_step(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor,
                    balanced: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """--inner-z batch: one forward whose detached z feeds the K MINE steps and whose
        graph the theta step reuses. CUDA work alone: `step_graph` captures it."""
        z = self._features(x)
        z_mi, c_mi = (z, c) if balanced is None else self._balanced_z(*balanced)
        z_critic = z_mi.detach()
        for _ in range(self.cfg.K):
            self._mine_step(z_critic, c_mi)
        return self._model_step(y, c_mi, z, z_mi=z_mi)

    def _balanced_z(self, x: torch.Tensor, c: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """With grad only when the penalty moves theta."""
        if self.cfg.lam > 0:
            return self._features(x), c
        with torch.no_grad():
            return self._features(x), c

    def _model_step(self, y: torch.Tensor, c: torch.Tensor, z: torch.Tensor,
                    balanced: tuple[torch.Tensor, torch.Tensor] | None = None,
                    z_mi: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MI term reads (z_mi, c) (default: the task's z), or the `balanced` batch."""
        if balanced is not None:
            z_mi, c = self._balanced_z(*balanced)
        z_mi = z if z_mi is None else z_mi
        logits = self.f(z)
        loss_task = F.cross_entropy(logits, y)
        theta = [p for p in self.g.parameters() if p.requires_grad]
        psi = [p for p in self.f.parameters() if p.requires_grad]
        self.model_opt.zero_grad(set_to_none=True)
        if self.cfg.lam == 0:
            loss_task.backward()
            with torch.no_grad():
                mi = self.mine.lower_bound(z_mi.detach(), c, self.method_gen)
            self.model_opt.step()
            return loss_task.detach(), mi
        mi = self.mine.lower_bound(z_mi, c, self.method_gen)
        # The guard decides on the device (computed, then masked): the host never waits.
        skip = ~(mi.detach() >= 0) if self.cfg.mi_guard else None
        if skip is not None:
            self._guarded += skip
        g_task = torch.autograd.grad(loss_task, theta + psi, retain_graph=True)
        # Only theta's MI gradient is taken: phi is trained by ascent alone, psi by L_task.
        g_mi = torch.autograd.grad(mi, theta, allow_unused=True)
        used = [i for i, gm in enumerate(g_mi) if gm is not None]
        g_task_used = [g_task[i] for i in used]
        g_mi_used = [g_mi[i] for i in used]
        if self.cfg.rescale_mi_grad:
            g_mi_used = rescaled_mi_grads(g_task_used, g_mi_used)
        for p, gt in zip(theta + psi, g_task, strict=True):
            p.grad = gt
        if self.mi_opt is None:  # "joint": one Adam step on the sum
            combined = torch._foreach_add(g_task_used, torch._foreach_mul(g_mi_used,
                                                                           self.cfg.lam))
            for i, summed in zip(used, combined, strict=True):
                theta[i].grad = summed if skip is None else torch.where(skip, g_task[i], summed)
            self.model_opt.step()
            return loss_task.detach(), mi.detach()
        # "separate": both gradients are taken at the same theta (the authors' code takes the
        # MI one after the task step, in a second session run; one forward serves both here).
        self.model_opt.step()
        self.mi_opt.zero_grad(set_to_none=True)
        for i, gm in zip(used, g_mi_used, strict=True):
            theta[i].grad = gm
        step_unless(self.mi_opt, skip)
        return loss_task.detach(), mi.detach()

    @property
    def guarded_steps(self) -> int:
        return int(self._guarded)

    def epoch_stats(self, loss_task: float, penalty: float, time_s: float) -> EpochStats:
        guarded = (self.guarded_steps / self.theta_steps if self.cfg.mi_guard and self.theta_steps
                   else math.nan)
        return EpochStats(self.epoch, loss_task, penalty, time_s, mi_batch=penalty,
                          guarded_frac=guarded, graphed=self.graphed())

    def graphed(self) -> bool | None:
        if not self.cfg.cuda_graphs:
            return None
        return self.step_graph is not None and self.step_graph.in_use("trial")

    def train_mi(self, z: torch.Tensor, c: torch.Tensor) -> float:
        weights = None if self.row_weight is None else rows_of(self.row_weight, self.eval_rows)
        return estimate_mi(self.mine, z, c, self.cfg.batch_size,
                           generator=self.eval_generator(), weights=weights)

    def extra_state(self) -> dict:
        return {"mine": self.mine.state_dict(), "mine_opt": self.mine_opt.state_dict(),
                "mi_opt": None if self.mi_opt is None else self.mi_opt.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.mine.load_state_dict(state["mine"])
        self.mine_opt.load_state_dict(state["mine_opt"])
        if self.mi_opt is not None and state.get("mi_opt") is not None:
            self.mi_opt.load_state_dict(state["mi_opt"])
        # A checkpoint's optimiser groups carry the flag of the run that wrote it.
        self._capturable(self.step_graph is not None)


def rescaled_mi_grads(g_task: list[torch.Tensor], g_mi: list[torch.Tensor]
                      ) -> list[torch.Tensor]:
    """Each g_mi scaled to norm min(|g_task|, |g_mi|) (the authors' code), by foreach kernels."""
    mi_norms = torch._foreach_norm(g_mi)
    scales = torch._foreach_div(torch._foreach_minimum(torch._foreach_norm(g_task), mi_norms),
                                torch._foreach_add(mi_norms, 1e-12))
    return torch._foreach_mul(g_mi, scales)


def step_unless(opt: torch.optim.Optimizer, skip: torch.Tensor | None) -> None:
    """opt.step() unless `skip`. A fused optimiser decides on the device by its found_inf
    input, as under a GradScaler: no host sync."""
    if skip is None:
        opt.step()
    elif all(group.get("fused") for group in opt.param_groups):
        opt.found_inf = skip.float()  # the fused kernels then update nothing, keep the count
        try:
            opt.step()
        finally:
            del opt.found_inf
    elif not bool(skip):
        opt.step()
