"""Algorithm 1 of the paper as a reusable loop, one epoch at a time.

Per outer step t: K gradient-ascent steps on phi (the statistics network) for L_ne, then one
step of theta (feature extractor g) on L_task + lam * L_ne and of psi (classifier f) on L_task.
With lam = 0 the model is trained by plain ERM while MINE still trains alongside, so the MI of
every model is measured the same way (the paper's Fig. 3).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import Benchmark, Split, SplitOutputs, TensorSplit
from unbiased.mine import MINE, estimate_mi, shuffled_within
from unbiased.models import linear_classifier

InnerZ = Literal["fresh", "batch", "bank"]
INNER_Z_MODES: tuple[str, ...] = ("fresh", "batch", "bank")
MINE_OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")
THETA_UPDATES: tuple[str, ...] = ("separate", "joint")


@dataclass
class LoopConfig:
    """Hyper-parameters of Algorithm 1 (validated at the edge; see `validate`)."""

    lam: float = 1.0
    K: int = 80
    batch_size: int = 1024
    lr: float = 1e-4
    mine_lr: float = 1e-4
    mine_optimizer: str = "adam"
    # Where the K inner steps get z: "fresh" = new mini-batches through g without grad, as
    # Algorithm 1 states; "batch" = the current batch's z (computed once) with new shuffles;
    # "bank" = new mini-batches drawn from a bank of z of the whole training set, computed
    # without grad and recomputed every `bank_refresh` outer steps (and at each epoch start).
    # Theta is fixed during the K steps, so with bank_refresh = 1 "bank" equals "fresh".
    inner_z: str = "fresh"
    bank_refresh: int = 10
    # "bank" only: None = z of the whole training set; N = z of a random pool of N training
    # rows, drawn anew at each refresh, so a refresh costs N forwards instead of len(train).
    bank_size: int | None = None
    # The authors' code rescales the MI gradient of each theta tensor to norm
    # min(|g_task|, |g_MI|) so the unbounded MI term cannot swamp the task gradient.
    rescale_mi_grad: bool = True
    # How theta takes the two gradients. "separate" (the authors' digit_model.py): the task
    # gradient through Adam(lr), the (rescaled) MI gradient through a second Adam(lr * lam)
    # with its own moments, so the penalty keeps a step size of its own however small its
    # gradient gets. "joint": one Adam step on g_task + lam * g_MI; with rescaling the MI
    # part can never outgrow the task gradient, which shrinks as the task is fitted, and on
    # full MNIST the penalty then fades (README, "Measured").
    theta_update: str = "separate"
    # MINE's bias-corrected gradient (moving average of E[exp T]); None = plain DV gradient.
    mine_ema_rate: float | None = None
    mine_hidden: int = 64
    mine_hidden_layers: int = 2
    # Rows per forward pass when g runs over a whole split (evaluation, z bank): large for
    # small inputs, small for images (a ResNet-50 batch of 4096 would not fit).
    eval_batch_size: int = 4096
    # Speed options, off by default (measured in bench/RESULTS.md). `amp`: g runs under bf16
    # autocast (z, f, MINE and every loss stay fp32). `compile`: torch.compile g and T in
    # place (state_dict keys unchanged). `channels_last`: g's weights and 4-d tensor inputs in
    # channels-last memory format (conv backbones on GPU).
    amp: bool = False
    compile: bool = False
    channels_last: bool = False

    def validate(self) -> LoopConfig:
        problems = []
        if not (self.lam >= 0 and math.isfinite(self.lam)):
            problems.append(f"lam must be >= 0, got {self.lam}")
        if self.K < 1:
            problems.append(f"K must be >= 1, got {self.K}")
        if self.batch_size < 2:
            problems.append(f"batch_size must be >= 2, got {self.batch_size}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not self.mine_lr > 0:
            problems.append(f"mine_lr must be > 0, got {self.mine_lr}")
        if self.mine_optimizer not in MINE_OPTIMIZERS:
            problems.append(f"mine_optimizer must be one of {MINE_OPTIMIZERS}, "
                            f"got {self.mine_optimizer!r}")
        if self.eval_batch_size < 1:
            problems.append(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if self.bank_refresh < 1:
            problems.append(f"bank_refresh must be >= 1, got {self.bank_refresh}")
        if self.bank_size is not None and self.bank_size < 2:
            problems.append(f"bank_size must be >= 2 or None, got {self.bank_size}")
        if self.inner_z not in INNER_Z_MODES:
            problems.append(f"inner_z must be one of {INNER_Z_MODES}, got {self.inner_z!r}")
        if self.theta_update not in THETA_UPDATES:
            problems.append(f"theta_update must be one of {THETA_UPDATES}, "
                            f"got {self.theta_update!r}")
        if self.mine_ema_rate is not None and not 0 < self.mine_ema_rate <= 1:
            problems.append(f"mine_ema_rate must be in (0, 1], got {self.mine_ema_rate}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass
class EpochStats:
    epoch: int
    loss_task: float
    mi_batch: float  # mean L_ne seen by the theta steps during the epoch
    time_s: float


class Algorithm1:
    """g, f and MINE with their optimisers and the sampling RNG; `run_epoch` trains one
    epoch, `evaluate` measures it; `state_dict` holds everything needed to resume exactly."""

    def __init__(self, bench: Benchmark, cfg: LoopConfig, seed: int,
                 device: torch.device | str = "cpu"):
        self.cfg = cfg.validate()
        self.bench = bench
        self.device = torch.device(device)
        torch.manual_seed(seed)
        self.g = bench.make_features().to(self.device)
        if cfg.channels_last:
            self.g = self.g.to(memory_format=torch.channels_last)
            self.bench = bench = _channels_last(bench)  # once: x[idx] keeps the format
        self.f = linear_classifier(bench.z_dim, bench.num_classes).to(self.device)
        self.mine = MINE(bench.z_dim, bench.c_dim, cfg.mine_hidden, cfg.mine_hidden_layers,
                         cfg.mine_ema_rate).to(self.device)
        # Fused optimiser kernels: one call per step instead of several per tensor, a large
        # part of the cost of K inner steps on a 3-layer T (bench/RESULTS.md).
        fused = self.device.type in ("cpu", "cuda")
        self.model_opt = torch.optim.Adam([*self.g.parameters(), *self.f.parameters()],
                                          lr=cfg.lr, fused=fused)
        # "separate": theta's MI gradient gets an Adam of its own (lr * lam), as the authors'.
        self.mi_opt: torch.optim.Optimizer | None = None
        if cfg.theta_update == "separate" and cfg.lam > 0:
            self.mi_opt = torch.optim.Adam(self.g.parameters(), lr=cfg.lr * cfg.lam,
                                           fused=fused)
        if cfg.mine_optimizer == "adam":
            self.mine_opt: torch.optim.Optimizer = torch.optim.Adam(
                self.mine.parameters(), lr=cfg.mine_lr, fused=fused)
        else:
            self.mine_opt = torch.optim.SGD(self.mine.parameters(), lr=cfg.mine_lr, fused=fused)
        if cfg.compile:
            # The theta step backpropagates twice through one graph (retain_graph=True), which
            # compiled backwards with donated buffers refuse; turn donation off (process-wide).
            torch._functorch.config.donated_buffer = False
            self.g.compile()
            self.mine.T.compile()
        # One generator on the training device drives every sampling decision (batch order,
        # inner batches, shuffles of c), so a run is reproducible and resumable from its saved
        # state, and on a GPU no index tensor is copied from the host per step.
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.epoch = 0
        self._bank: torch.Tensor | None = None
        self._bank_c: torch.Tensor | None = None
        self._bank_rows: torch.Tensor | None = None  # the pool's rows; None = the whole set
        self._bank_age = 0
        self._inner_pick: torch.Tensor | None = None  # rows of the last inner batch
        self.last_train_z: torch.Tensor | None = None  # training z of the last evaluate()

    # -- one outer step -------------------------------------------------------------------
    def _indices(self, n: int, size: int) -> torch.Tensor:
        # Sampling with replacement: O(size) instead of a permutation of the whole set.
        return torch.randint(n, (size,), generator=self.gen,
                             device=self.gen.device).to(self.device)

    def _permutation(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen, device=self.gen.device).to(self.device)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        """z = g(x), under bf16 autocast when `amp` is on (z comes back as fp32)."""
        if not self.cfg.amp:
            return self.g(x)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return self.g(x).float()

    def _refresh_bank(self, train: Split) -> None:
        size, chunk = self.cfg.bank_size, self.cfg.eval_batch_size
        if size is None or size >= len(train):
            self._bank_rows, self._bank_c = None, train.c
            batches = train.batches(chunk)
        else:  # a pool: `size` distinct rows, drawn anew at each refresh
            self._bank_rows = self._permutation(len(train))[:size]
            self._bank_c = train.c[self._bank_rows]
            batches = train.batches(chunk, self._bank_rows)
        with torch.no_grad():
            self._bank = torch.cat([self._features(x) for x, _, _ in batches])
        self._bank_age = 0

    def last_inner_rows(self) -> torch.Tensor | None:
        """Training-set rows of the last inner MINE batch (a test compares its z with a fresh
        forward of the same rows)."""
        pick = self._inner_pick
        if self.cfg.inner_z == "bank" and pick is not None and self._bank_rows is not None:
            return self._bank_rows[pick]
        return pick

    def _inner_batches(self, train: Split, z_batch: torch.Tensor | None,
                       c_batch: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The K (z, c) pairs of the inner MINE steps, each drawn just before its step."""
        mode = self.cfg.inner_z
        if mode == "bank" and (self._bank is None or self._bank_age >= self.cfg.bank_refresh):
            self._refresh_bank(train)
        for _ in range(self.cfg.K):
            if mode == "batch":
                yield z_batch, c_batch
                continue
            # a new mini-batch: from the bank (whole set or pool), or through g without grad
            if mode == "bank":
                pick = self._indices(len(self._bank), len(c_batch))
                self._inner_pick = pick
                yield self._bank[pick], self._bank_c[pick]
                continue
            idx = self._indices(len(train), len(c_batch))
            self._inner_pick = idx
            [(x, _, c)] = list(train.batches(len(idx), idx))
            with torch.no_grad():
                z = self._features(x)
            yield z, c

    def _mine_steps(self, train: Split, z_batch: torch.Tensor | None,
                    c_batch: torch.Tensor) -> None:
        for z, c in self._inner_batches(train, z_batch, c_batch):
            loss, _ = self.mine.phi_loss(z, c, self.gen)
            self.mine_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.mine_opt.step()
        self._bank_age += 1

    def _model_step(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor,
                    z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Detached tensors, not floats: no device sync per step (they are read once per epoch).
        logits = self.f(z)
        loss_task = F.cross_entropy(logits, y)
        theta = [p for p in self.g.parameters() if p.requires_grad]
        psi = [p for p in self.f.parameters() if p.requires_grad]
        self.model_opt.zero_grad(set_to_none=True)
        if self.cfg.lam == 0:
            loss_task.backward()
            with torch.no_grad():
                mi = self.mine.lower_bound(z.detach(), c, self.gen)
            self.model_opt.step()
            return loss_task.detach(), mi
        mi = self.mine.lower_bound(z, c, self.gen)
        g_task = torch.autograd.grad(loss_task, theta + psi, retain_graph=True)
        # Only theta's MI gradient is taken: phi is trained by ascent alone, psi by L_task.
        g_mi = torch.autograd.grad(mi, theta, allow_unused=True)
        for p, gt in zip(psi, g_task[len(theta):], strict=True):
            p.grad = gt
        if self.mi_opt is None:  # "joint": one Adam step on the sum
            for p, gt, gm in zip(theta, g_task[:len(theta)], g_mi, strict=True):
                p.grad = gt if gm is None else combine_grads(gt, gm, self.cfg.lam,
                                                             self.cfg.rescale_mi_grad)
            self.model_opt.step()
            return loss_task.detach(), mi.detach()
        # "separate": both gradients are taken at the same theta (the authors' code takes the
        # MI one after the task step, in a second session run; one forward serves both here).
        for p, gt in zip(theta, g_task[:len(theta)], strict=True):
            p.grad = gt
        self.model_opt.step()
        self.mi_opt.zero_grad(set_to_none=True)
        for p, gt, gm in zip(theta, g_task[:len(theta)], g_mi, strict=True):
            if gm is not None:
                p.grad = rescaled_mi_grad(gt, gm) if self.cfg.rescale_mi_grad else gm
        self.mi_opt.step()
        return loss_task.detach(), mi.detach()

    def run_epoch(self, train: Split | None = None) -> EpochStats:
        train = train if train is not None else self.bench.train
        self.last_train_z = None
        start = time.perf_counter()
        self.g.train()
        self.f.train()
        self.mine.train()
        order = self._permutation(len(train))
        self._bank = None  # recomputed at the first step: a resumed run matches a straight one
        bs = self.cfg.batch_size
        losses, mis = [], []
        for step, (x, y, c) in enumerate(train.batches(bs, order)):
            if len(y) < 2:  # a shuffle needs two rows
                continue
            self._inner_pick = order[step * bs:(step + 1) * bs]
            if self.cfg.inner_z == "batch":
                # One forward with grad; its detached z feeds the K MINE steps and the graph
                # is reused by the theta step (theta does not move during the inner loop).
                z = self._features(x)
                self._mine_steps(train, z.detach(), c)
            else:
                self._mine_steps(train, None, c)
                z = self._features(x)
            loss_task, mi = self._model_step(x, y, c, z)
            losses.append(loss_task)
            mis.append(mi)
        self.epoch += 1
        return EpochStats(self.epoch, _mean_t(losses), _mean_t(mis),
                          time.perf_counter() - start)

    # -- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def outputs(self, split: Split) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, logits) for a whole split, in eval mode, in chunks of eval_batch_size."""
        self.g.eval()
        self.f.eval()
        z = torch.cat([self._features(x) for x, _, _ in
                       split.batches(self.cfg.eval_batch_size)])
        return z, self.f(z)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """train_acc, mi (DV with the current T on the whole training set), one accuracy per
        evaluation split and the benchmark's extra metrics."""
        z, logits = self.outputs(self.bench.train)
        self.last_train_z = z  # for mi_eval of this epoch without a second pass over the set
        pred = logits.argmax(1)
        metrics = {"train_acc": _acc(pred, self.bench.train.y),
                   "mi": estimate_mi(self.mine, z, self.bench.train.c, self.cfg.batch_size,
                                     generator=self.gen)}
        outs = {"train": SplitOutputs(pred, self.bench.train.y, self.bench.train.c)}
        for name, split in self.bench.eval_splits.items():
            _, logits_e = self.outputs(split)
            pred_e = logits_e.argmax(1)
            metrics[name] = _acc(pred_e, split.y)
            outs[name] = SplitOutputs(pred_e, split.y, split.c)
        for fn in self.bench.extra_metrics:
            metrics.update(fn(outs))
        return metrics

    def train_features(self) -> torch.Tensor:
        return self.outputs(self.bench.train)[0]

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """A snapshot (deep copy): later training does not change it."""
        return copy.deepcopy({
            "epoch": self.epoch, "g": self.g.state_dict(), "f": self.f.state_dict(),
            "mine": self.mine.state_dict(), "model_opt": self.model_opt.state_dict(),
            "mine_opt": self.mine_opt.state_dict(), "gen": self.gen.get_state(),
            "mi_opt": None if self.mi_opt is None else self.mi_opt.state_dict(),
            "torch_rng": torch.get_rng_state(), "cfg": asdict(self.cfg)})

    def load_state_dict(self, state: dict) -> None:
        self.g.load_state_dict(state["g"])
        self.f.load_state_dict(state["f"])
        self.mine.load_state_dict(state["mine"])
        self.model_opt.load_state_dict(state["model_opt"])
        self.mine_opt.load_state_dict(state["mine_opt"])
        if self.mi_opt is not None and state.get("mi_opt") is not None:
            self.mi_opt.load_state_dict(state["mi_opt"])
        self.gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        self.epoch = int(state["epoch"])


def combine_grads(g_task: torch.Tensor, g_mi: torch.Tensor, lam: float,
                  rescale: bool) -> torch.Tensor:
    """g_task + lam * g_mi for one theta tensor; with `rescale`, g_mi is first scaled to norm
    min(|g_task|, |g_mi|) (the authors' code), keeping its direction."""
    if rescale:
        g_mi = rescaled_mi_grad(g_task, g_mi)
    return g_task + lam * g_mi


def rescaled_mi_grad(g_task: torch.Tensor, g_mi: torch.Tensor) -> torch.Tensor:
    """g_mi scaled to norm min(|g_task|, |g_mi|), its direction kept (the authors' code)."""
    mi_norm = g_mi.norm()
    return g_mi * (torch.minimum(g_task.norm(), mi_norm) / (mi_norm + 1e-12))


def mi_eval(z: torch.Tensor, c: torch.Tensor, seed: int = 0, steps: int = 2000,
            batch_size: int = 512, lr: float = 1e-3, hidden: int = 64, hidden_layers: int = 2,
            holdout: float = 0.2, given: torch.Tensor | None = None) -> float:
    """MI of frozen features z with c, judged by a statistics network the model never saw.

    A fresh T is trained on (1 - holdout) of the rows and the DV bound is reported on the held
    out rows, so the number is not inflated by T memorising the rows it was trained on.
    With `given` (labels y), the marginal rows shuffle c only among rows of the same label:
    a lower bound on I(z; c | y), the colour z carries beyond what its label explains. A model
    whose z encodes y alone scores ~0 on it, but about I(y; c) on the plain bound (~1.9 nats
    on Colored MNIST at sigma 0.03, where colour nearly fixes the class).
    """
    gen = torch.Generator(device=z.device).manual_seed(seed)  # on z's device: no copies
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mine = MINE(z.shape[1], c.shape[1], hidden, hidden_layers).to(z.device)
    perm = torch.randperm(len(z), generator=gen, device=z.device)
    n_hold = max(2, int(len(z) * holdout))
    hold, fit = perm[:n_hold], perm[n_hold:]
    z_fit, c_fit = z[fit], c[fit]
    given_fit = None if given is None else given[fit]
    opt = torch.optim.Adam(mine.parameters(), lr=lr, fused=z.device.type in ("cpu", "cuda"))
    bs = min(batch_size, len(fit))
    for _ in range(steps):
        idx = torch.randint(len(fit), (bs,), generator=gen, device=z.device)
        c_marg = None if given_fit is None else shuffled_within(c_fit[idx], given_fit[idx],
                                                                 gen)
        loss, _ = mine.phi_loss(z_fit[idx], c_fit[idx], gen, c_marg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return estimate_mi(mine, z[hold], c[hold], batch_size=None, shuffles=8, generator=gen,
                       given=None if given is None else given[hold])


def _acc(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float((pred == y).float().mean())


def _mean_t(values: list[torch.Tensor]) -> float:
    return float(torch.stack(values).double().mean()) if values else float("nan")


def _channels_last(bench: Benchmark) -> Benchmark:
    """The benchmark with 4-d tensor inputs converted to channels-last once (a copy)."""
    def convert(split: Split) -> Split:
        if not isinstance(split, TensorSplit) or split.x.dim() != 4:
            return split
        return TensorSplit(split.x.contiguous(memory_format=torch.channels_last), split.y,
                           split.c)
    return dataclasses.replace(bench, train=convert(bench.train),
                               eval_splits={k: convert(v) for k, v in bench.eval_splits.items()})


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
