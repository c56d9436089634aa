"""Trial bundles: several mi_backprop points trained as one (HFTA, arXiv 2102.02344).

Every weight, Adam moment and step count is stacked along a leading member axis; g, f and T
run once for all members under vmap, and one backward gives every member's gradients (they
share no weights). lam = 0 is a member whose MI step is always masked. A member's draws come
from its own generators in a single run's order, so it follows its run alone up to float
rounding. `sync_members()` writes the stacked state back into the members.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from unbiased.graphs import GraphedStep
from unbiased.methods.base import EpochStats
from unbiased.methods.mi_backprop import MIBackprop, mi_backprop_graph_obstacles
from unbiased.mine import permutation

# Config fields members may differ in; every other field must be equal.
PER_MEMBER_FIELDS: tuple[str, ...] = ("lam", "lr", "mi_lr", "mine_lr")
# The critic's shuffles. "exact": each member's own generator, as its run alone (B x (K + 1)
# draws an outer step). "batched": every member's in one draw from a bundle generator, one
# kernel instead of B x (K + 1), what a GPU needs; the shuffles then differ from the runs.
DRAWS: tuple[str, ...] = ("exact", "batched")
BATCHED_SEED_OFFSET = 4_000_037


def bundle_problems(members: list[MIBackprop]) -> list[str]:
    if not members:
        return ["a bundle needs at least one member"]
    if not all(type(m) is MIBackprop for m in members):
        return ["every member must be an mi_backprop trial"]
    problems = []
    cfg = members[0].cfg
    if cfg.inner_z != "batch":
        problems.append(f"bundles train inner_z 'batch' only, got {cfg.inner_z!r}")
    if cfg.mine_optimizer != "adam":
        problems.append(f"bundles train MINE with adam only, got {cfg.mine_optimizer!r}")
    if cfg.compile:
        problems.append("bundles run without compile")
    if cfg.optimizer != "adam" or cfg.weight_decay:
        problems.append(f"bundles train g and f with Adam without weight decay only, got "
                        f"{cfg.optimizer} with weight decay {cfg.weight_decay:g}")
    if cfg.schedule_adversaries:
        problems.append("bundles schedule g and f's lr only, not the critic's")
    if cfg.model != "benchmark" or cfg.input_norm != "none":
        problems.append(f"bundles train the benchmark's own model on its own input only, got "
                        f"model {cfg.model!r} with input_norm {cfg.input_norm!r}")
    shared = {k: v for k, v in asdict(cfg).items() if k not in PER_MEMBER_FIELDS}
    for m in members[1:]:
        other = {k: v for k, v in asdict(m.cfg).items() if k not in PER_MEMBER_FIELDS}
        differ = sorted(k for k in shared if shared[k] != other[k])
        if differ:
            problems.append(f"members differ in {', '.join(differ)} (only "
                            f"{', '.join(PER_MEMBER_FIELDS)} may)")
            break
    shapes = {(len(m.bench.train), tuple(m.bench.train.x.shape[1:]), m.bench.z_dim,
               m.bench.c_dim, m.bench.num_classes, m.device, m.epoch) for m in members}
    if len(shapes) > 1:
        problems.append("members differ in data size, input shape, z, c, classes, device "
                        "or epoch reached")
    return problems


class AdamState:
    """Adam for stacked parameters: torch's formula, no weight decay, no amsgrad."""

    def __init__(self, params: dict[str, torch.Tensor], betas: tuple[float, float],
                 eps: float) -> None:
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}
        first = next(iter(params.values()))
        self.step = torch.zeros(first.shape[0], dtype=torch.float32, device=first.device)
        self.beta1, self.beta2 = betas
        self.eps = eps

    @torch.no_grad()
    def update(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
               lr: torch.Tensor, skip: torch.Tensor | None = None,
               same_lr: float | None = None) -> None:
        """One step of every member at its own lr ([B]); a member where `skip` is true stays
        as it was. `same_lr` (shared, none skipping): torch's fused Adam steps all members at
        once, one kernel launch instead of a dozen a tensor."""
        keys = list(params)
        if skip is None and same_lr is not None and keys and params[keys[0]].device.type in (
                "cpu", "cuda"):
            self.step += 1
            step = self.step[0]  # every member's: they all stepped every time
            # The kernels read raw memory: a gradient out of vmap's backward may be strided.
            torch._fused_adam_(
                [params[k] for k in keys], [grads[k].contiguous() for k in keys],
                [self.exp_avg[k] for k in keys], [self.exp_avg_sq[k] for k in keys], [],
                [step] * len(keys), lr=same_lr, beta1=self.beta1, beta2=self.beta2,
                weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)
            return
        step = self.step + 1
        bc1 = 1 - self.beta1 ** step.double()
        bc2_sqrt = (1 - self.beta2 ** step.double()).sqrt()
        step_size = (lr / bc1).float()
        bc2_sqrt = bc2_sqrt.float()
        for key, p in params.items():
            shape = (-1,) + (1,) * (p.dim() - 1)
            grad = grads[key]
            exp_avg = self.exp_avg[key].lerp(grad, 1 - self.beta1)
            exp_avg_sq = self.exp_avg_sq[key] * self.beta2 + (1 - self.beta2) * grad * grad
            denom = exp_avg_sq.sqrt() / bc2_sqrt.view(shape) + self.eps
            moved = p - step_size.view(shape) * exp_avg / denom
            if skip is not None:
                keep = skip.view(shape)
                moved = torch.where(keep, p, moved)
                exp_avg = torch.where(keep, self.exp_avg[key], exp_avg)
                exp_avg_sq = torch.where(keep, self.exp_avg_sq[key], exp_avg_sq)
            p.copy_(moved)
            self.exp_avg[key].copy_(exp_avg)
            self.exp_avg_sq[key].copy_(exp_avg_sq)
        self.step.copy_(step if skip is None else torch.where(skip, self.step, step))

    def load(self, opts: list[torch.optim.Optimizer | None], modules: list[nn.Module]) -> None:
        for b, opt, key, p in _member_params(opts, modules):
            state = opt.state.get(p)
            if state:
                self.exp_avg[key][b].copy_(state["exp_avg"])
                self.exp_avg_sq[key][b].copy_(state["exp_avg_sq"])
                self.step[b] = float(state["step"])

    def store(self, opts: list[torch.optim.Optimizer | None], modules: list[nn.Module]) -> None:
        for b, opt, key, p in _member_params(opts, modules):
            state = opt.state[p]
            state["step"] = self.step[b].clone().to(p.device)
            state["exp_avg"] = self.exp_avg[key][b].clone().contiguous(
                memory_format=_format_of(p))
            state["exp_avg_sq"] = self.exp_avg_sq[key][b].clone().contiguous(
                memory_format=_format_of(p))


def _member_params(opts: list[torch.optim.Optimizer | None], modules: list[nn.Module]
                   ) -> Iterator[tuple[int, torch.optim.Optimizer, str, nn.Parameter]]:
    """(member, its optimiser, name, parameter) of every member that has an optimiser."""
    for b, (opt, module) in enumerate(zip(opts, modules, strict=True)):
        if opt is not None:
            for key, p in module.named_parameters():
                yield b, opt, key, p


# The layers bf16 autocast runs in bf16 (input, weight and bias cast; output bf16).
AUTOCAST_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


class StackedModule:
    """One module's weights stacked over members, called for all members at once.

    `bf16`: the casts are explicit because torch.autocast does not reach into vmap (its
    batching rules call lower ops not on autocast's lists): inputs by a pre-hook, weights
    before the call, differentiably, as autocast's are."""

    def __init__(self, modules: list[nn.Module], bf16: bool = False) -> None:
        self.modules = modules
        self.base = copy.deepcopy(modules[0]).to("meta")
        self.params = {k: torch.stack([dict(m.named_parameters())[k].detach()
                                       for m in modules]).contiguous().requires_grad_()
                       for k, _ in modules[0].named_parameters()}
        self.buffers = {k: torch.stack([dict(m.named_buffers())[k] for m in modules])
                        for k, _ in modules[0].named_buffers()}
        self.low: frozenset[str] = frozenset()
        if bf16:
            low = []
            for name, layer in self.base.named_modules():
                if isinstance(layer, AUTOCAST_LAYERS):
                    layer.register_forward_pre_hook(_inputs_to_bf16)
                    low += [f"{name}.{k}" if name else k for k, _ in layer.named_parameters()]
            self.low = frozenset(low)

    def __call__(self, *args: torch.Tensor, member_dim: int = 0) -> torch.Tensor:
        """The members' outputs stacked on dim 0; the inputs' member axis is `member_dim`."""
        def one(params, buffers, *inputs):
            return functional_call(self.base, (params, buffers), inputs)
        in_dims = (0, 0, *([member_dim] * len(args)))
        params = {k: v.to(torch.bfloat16) if k in self.low else v
                  for k, v in self.params.items()}
        return vmap(one, in_dims=in_dims)(params, self.buffers, *args)

    @torch.no_grad()
    def store(self) -> None:
        for b, module in enumerate(self.modules):
            for key, p in module.named_parameters():
                p.copy_(self.params[key][b])
            for key, buf in module.named_buffers():
                buf.copy_(self.buffers[key][b])


class MIBackpropBundle:
    def __init__(self, members: list[MIBackprop], draws: str = "exact") -> None:
        problems = bundle_problems(members)
        if draws not in DRAWS:
            problems.append(f"draws must be one of {DRAWS}, got {draws!r}")
        if problems:
            raise ValueError("; ".join(problems))
        self.members = members
        self.draws = draws
        self._perms: torch.Tensor | None = None  # "batched": this outer step's shuffles
        self._drawn = 0
        self.cfg = members[0].cfg
        self.device = members[0].device
        self.g = StackedModule([m.g for m in members], bf16=self.cfg.amp)
        self.f = StackedModule([m.f for m in members])
        self.T = StackedModule([m.mine.T for m in members])
        self.log_ema = torch.stack([m.mine.log_ema for m in members])

        def vector(values: list[float]) -> torch.Tensor:
            # float64: a single run's lr is a Python float (its step size is computed in
            # double before it meets the float32 weights).
            return torch.tensor(values, dtype=torch.float64, device=self.device)
        cfgs = [m.cfg for m in members]
        self.lam = vector([c.lam for c in cfgs])
        self.lr = vector([c.lr for c in cfgs])
        self.mine_lr = vector([c.mine_lr for c in cfgs])
        self.mi_lr = vector([c.mi_lr if c.mi_lr is not None else c.lr * c.lam for c in cfgs])
        # The lr every member shares (None: they differ): their Adam steps fuse into one.
        self._lr = cfgs[0].lr if len({c.lr for c in cfgs}) == 1 else None
        self._mine_lr = cfgs[0].mine_lr if len({c.mine_lr for c in cfgs}) == 1 else None
        # lam = 0: a single run takes no MI step at all; here it is always masked.
        self.no_mi_step = self.lam == 0

        adam = members[0].model_opt.defaults
        betas, eps = adam["betas"], adam["eps"]
        self.model_adam = AdamState({**_prefixed("g.", self.g.params),
                                     **_prefixed("f.", self.f.params)}, betas, eps)
        self.mine_adam = AdamState(self.T.params, betas, eps)
        self.mi_adam = (AdamState(self.g.params, betas, eps)
                        if self.cfg.theta_update == "separate" else None)
        for adam, opts, modules in self._optimizer_states():
            adam.load(opts, modules)
        self.guarded = torch.zeros(len(members), dtype=torch.int64, device=self.device)
        self.theta_steps = 0
        # A frozen member (diverged) takes no more steps; the others go on.
        self.frozen = torch.zeros(len(members), dtype=torch.bool, device=self.device)
        self._any_frozen = False
        self._batched_gen = torch.Generator(device=self.device)
        self._seed_batched_draws()
        # The schedule's factor is 1: a schedule is an obstacle to graphs.
        self.step_graph: GraphedStep | None = None
        if self.cfg.cuda_graphs:
            obstacles = mi_backprop_graph_obstacles(self.cfg, self.device)
            if obstacles:
                print(f"cuda graphs: off ({'; '.join(obstacles)}): this bundle runs eager",
                      flush=True)
            else:
                self.step_graph = GraphedStep(
                    lambda x, y, c: self.update(x, y, c, 1.0),
                    [self._batched_gen, *(m.method_gen for m in members)])

    def freeze(self, member: int) -> None:
        """Every later step of the member is masked."""
        self.frozen[member] = True
        self._any_frozen = True
        if self.step_graph is not None:
            self.step_graph.reset()  # the masked Adam path from here: captured anew

    def _fused_or_masked(self, same_lr: float | None
                         ) -> tuple[torch.Tensor | None, float | None]:
        """AdamState.update's (skip, same_lr): fused while no member is frozen."""
        return (self.frozen, None) if self._any_frozen else (None, same_lr)

    @property
    def epoch(self) -> int:
        return self.members[0].epoch

    def _model_modules(self) -> list[nn.Module]:
        return [_Named({"g": m.g, "f": m.f}) for m in self.members]

    def _optimizer_states(self) -> list[tuple[AdamState, list, list[nn.Module]]]:
        """Each stacked Adam with the members' optimisers and modules it stands for."""
        states = [(self.model_adam, [m.model_opt for m in self.members], self._model_modules()),
                  (self.mine_adam, [m.mine_opt for m in self.members],
                   [m.mine.T for m in self.members])]
        if self.mi_adam is not None:
            states.append((self.mi_adam, [m.mi_opt for m in self.members],
                           [m.g for m in self.members]))
        return states

    def _shuffled(self, c: torch.Tensor) -> torch.Tensor:
        n = c.shape[1]
        if self.draws == "batched":
            perms = self._perms[self._drawn]
            self._drawn += 1
        else:
            perms = torch.stack([permutation(n, m.method_gen, self.device)
                                 for m in self.members])
        return torch.gather(c, 1, perms.unsqueeze(2).expand(-1, -1, c.shape[2]))

    def _draw_step(self, n: int) -> None:
        if self.draws != "batched":
            return
        keys = torch.randint(0, 1 << 62, (self.cfg.K + 1, len(self.members), n),
                             generator=self._batched_gen, device=self.device)
        self._perms = keys.argsort(dim=-1)
        self._drawn = 0

    def _seed_batched_draws(self) -> None:
        """Seeded per epoch, so a bundle resumed at an epoch's start draws the same."""
        seed = BATCHED_SEED_OFFSET + 104_729 * self.epoch
        for m in self.members:
            seed = (seed * 1_000_003 + m.seed) % (1 << 62)
        self._batched_gen.manual_seed(seed)  # the same object: a graph has it registered

    def _scores(self, z: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = c.shape[1]
        t = self.T(torch.cat([z, z], 1), torch.cat([c, self._shuffled(c)], 1))
        return t[:, :n], t[:, n:]

    def _critic_step(self, z: torch.Tensor, c: torch.Tensor) -> None:
        t_joint, t_marg = self._scores(z, c)
        log_mean_exp = torch.logsumexp(t_marg, dim=1) - math.log(t_marg.shape[1])
        rate = self.cfg.mine_ema_rate or None  # 0: the plain DV gradient
        if rate is None:
            objective = t_joint.mean(1) - log_mean_exp
        else:
            with torch.no_grad():
                if rate == 1.0:
                    moved = log_mean_exp
                else:
                    moved = torch.logaddexp(self.log_ema + math.log1p(-rate),
                                            log_mean_exp + math.log(rate))
                    moved = torch.where(torch.isnan(self.log_ema), log_mean_exp, moved)
                self.log_ema.copy_(torch.where(self.frozen, self.log_ema, moved))
            objective = t_joint.mean(1) - torch.exp(log_mean_exp - self.log_ema)
        grads = torch.autograd.grad(-objective.sum(), list(self.T.params.values()))
        self.mine_adam.update(self.T.params, dict(zip(self.T.params, grads, strict=True)),
                              self.mine_lr, *self._fused_or_masked(self._mine_lr))

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, factor: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One outer step of every member (x [n, B, ...], y [B, n], c [B, n, d]). x has the
        member axis second: vmap's grouped convolution is then a free reshape
        (bench/RESULTS.md, "Trial bundles")."""
        self._draw_step(y.shape[1])
        z = self.g(x, member_dim=1)
        if self.cfg.amp:  # g's layers ran in bf16; z is fp32, as MIBackprop._features's
            z = z.float()
        z_critic = z.detach()
        for _ in range(self.cfg.K):
            self._critic_step(z_critic, c)
        logits = self.f(z)
        loss_task = F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                    reduction="none").view(y.shape).mean(1)
        t_joint, t_marg = self._scores(z, c)
        mi = t_joint.mean(1) - (torch.logsumexp(t_marg, dim=1) - math.log(t_marg.shape[1]))
        skip = self.no_mi_step | self.frozen
        if self.cfg.mi_guard:
            guarded = ~(mi.detach() >= 0) & ~self.no_mi_step & ~self.frozen
            self.guarded += guarded
            skip |= guarded
        theta, psi = self.g.params, self.f.params
        g_task = torch.autograd.grad(loss_task.sum(), [*theta.values(), *psi.values()],
                                     retain_graph=True)
        g_mi = torch.autograd.grad(mi.sum(), list(theta.values()))
        task_theta = dict(zip(theta, g_task[:len(theta)], strict=True))
        task_psi = dict(zip(psi, g_task[len(theta):], strict=True))
        mi_theta = dict(zip(theta, g_mi, strict=True))
        if self.cfg.rescale_mi_grad:
            mi_theta = {k: _rescaled(task_theta[k], g) for k, g in mi_theta.items()}
        lr = self.lr * factor
        fused = self._fused_or_masked(None if self._lr is None else self._lr * factor)
        theta_grads = task_theta
        if self.mi_adam is None:  # "joint": one Adam step on the sum
            theta_grads = {}
            for k, gt in task_theta.items():
                shape = (-1,) + (1,) * (gt.dim() - 1)
                summed = gt + self.lam.float().view(shape) * mi_theta[k]
                theta_grads[k] = torch.where(skip.view(shape), gt, summed)
        self.model_adam.update({**_prefixed("g.", theta), **_prefixed("f.", psi)},
                               {**_prefixed("g.", theta_grads), **_prefixed("f.", task_psi)},
                               lr, *fused)
        if self.mi_adam is not None:
            self.mi_adam.update(theta, mi_theta, self.mi_lr * factor, skip)
        return loss_task.detach(), mi.detach()

    def run_epoch(self) -> list[EpochStats]:
        start = time.perf_counter()
        first = self.members[0]
        for m in self.members:
            for module in m.modules().values():
                module.train()
        orders = [m.epoch_order(len(m.bench.train)) for m in self.members]
        self._seed_batched_draws()
        self.guarded.zero_()
        self.theta_steps = 0
        bs = self.cfg.batch_size
        n = len(first.bench.train)
        steps_per_epoch = -(-n // bs)
        losses, penalties = [], []
        for step in range(steps_per_epoch):
            rows = [order[step * bs:(step + 1) * bs] for order in orders]
            if len(rows[0]) < 2:  # a shuffle (and a batch statistic) needs two rows
                continue
            factor = first.lr_factor(step, steps_per_epoch)
            splits = [m.bench.train for m in self.members]
            x = torch.stack([s.x[r] for s, r in zip(splits, rows, strict=True)], dim=1)
            y = torch.stack([s.y[r] for s, r in zip(splits, rows, strict=True)])
            c = torch.stack([s.c[r] for s, r in zip(splits, rows, strict=True)])
            self.theta_steps += 1
            if self.step_graph is not None:
                loss_task, mi = self.step_graph(x, y, c)
            else:
                loss_task, mi = self.update(x, y, c, factor)
            losses.append(loss_task)
            penalties.append(mi)
        for m in self.members:
            m.epoch += 1
        self.sync_members()
        time_s = time.perf_counter() - start
        loss_means = _means(losses, len(self.members))
        mi_means = _means(penalties, len(self.members))
        guarded = self.guarded.tolist()
        return [EpochStats(m.epoch, loss_means[b], mi_means[b], time_s, mi_batch=mi_means[b],
                           guarded_frac=(guarded[b] / self.theta_steps if self.cfg.mi_guard
                                         and m.cfg.lam > 0 and self.theta_steps else math.nan),
                           graphed=self.graphed())
                for b, m in enumerate(self.members)]

    def graphed(self) -> bool | None:
        if not self.cfg.cuda_graphs:
            return None
        return self.step_graph is not None and self.step_graph.in_use("bundle")

    def sync_members(self) -> None:
        self.g.store()
        self.f.store()
        self.T.store()
        with torch.no_grad():
            for b, m in enumerate(self.members):
                m.mine.log_ema.copy_(self.log_ema[b])
        for adam, opts, modules in self._optimizer_states():
            adam.store(opts, modules)
        for b, m in enumerate(self.members):
            if m.cfg.lam > 0:
                m.theta_steps = self.theta_steps
                m._guarded.copy_(self.guarded[b])


class _Named(nn.Module):
    """Modules under prefixes, so named_parameters() reads "g.…" and "f.…"."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)


def _inputs_to_bf16(_layer: nn.Module, inputs: tuple) -> tuple:
    return tuple(t.to(torch.bfloat16) if torch.is_tensor(t) and t.is_floating_point() else t
                 for t in inputs)


def _prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in tensors.items()}


def _rescaled(g_task: torch.Tensor, g_mi: torch.Tensor) -> torch.Tensor:
    """mi_backprop's rescaled_mi_grads, per member."""
    mi_norm = g_mi.flatten(1).norm(dim=1)
    scale = torch.minimum(g_task.flatten(1).norm(dim=1), mi_norm) / (mi_norm + 1e-12)
    return g_mi * scale.view((-1,) + (1,) * (g_mi.dim() - 1))


def _means(values: list[torch.Tensor], members: int) -> list[float]:
    if not values:
        return [math.nan] * members
    return torch.stack(values).double().mean(0).tolist()


def _format_of(p: torch.Tensor) -> torch.memory_format:
    return (torch.channels_last if p.dim() == 4 and p.is_contiguous(
        memory_format=torch.channels_last) and not p.is_contiguous()
        else torch.contiguous_format)
