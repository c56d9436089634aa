"""`ERM`, the base of every method (DomainBed's style): a method overrides `update` (one
mini-batch) and, with modules of its own, `extra_state` / `load_extra_state`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from unbiased.data import (
    VAL_SPLIT,
    Benchmark,
    GroupSampler,
    Split,
    SplitOutputs,
    TensorSplit,
    balanced_weights,
    capped_group_rows,
    group_accuracies,
)
from unbiased.mine import permutation
from unbiased.models import INPUT_NORMS, MODELS, InputNorm, map_channels
from unbiased.search import Choice, LogUniform, Space
from unbiased.settings import setting, setting_problems

# Seed offsets of the streams besides the data order: the evaluated training rows; the
# method's own draws, so a lam = 0 trial is the same ERM under every method; and each
# epoch's evaluation, so evaluating never moves training.
EVAL_ROWS_SEED_OFFSET = 1_000_003
METHOD_SEED_OFFSET = 2_000_003
EVAL_SEED_OFFSET = 3_000_017
# A restore on another kind of device cannot take over the generator states (a CUDA one's is
# 16 bytes, a CPU one's 5,056): they are re-seeded from the seed and the epoch reached.
RESEED_EPOCH_STRIDE = 104_729
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine", "step")
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")
SAMPLERS: tuple[str, ...] = ("method", "uniform", "groups")


@dataclass
class TrainConfig:
    """`reads_map_z`: the method works on a feature-map z, not only a vector z."""

    reads_map_z: ClassVar[bool] = True

    lam: float = setting(1.0, "each method's penalty weight; 0 = plain ERM", ge=0, axis=True)
    # >= 2: a shuffle (and a batch statistic) needs two rows.
    batch_size: int = setting(1024, "mini-batch size", ge=2)
    lr: float = setting(1e-4, "learning rate of g and f", gt=0)
    baseline_lr: float | None = setting(
        None, "learning rate of g and f in a lam = 0 trial (default: --lr); Kim et al. "
              "train their baseline at 0.01 and fine-tune LNTL from it at 0.001", gt=0)
    # The adversaries keep their lr so they can follow a g that slows down: on a fast
    # schedule a constant lr let g outrun the critic after its peak (docs/MEASURED.md).
    lr_schedule: str = setting(
        "constant", "g and f's lr held, decayed to 0 by a half cosine over --epochs, or cut "
                    "in steps (--lr-step-epochs, --lr-step-rate); critics and bias heads keep "
                    "theirs unless --schedule-adversaries", choices=LR_SCHEDULES)
    lr_step_epochs: int = setting(
        40, "with --lr-schedule step: the lr falls by --lr-step-rate every this many epochs "
            "(Kim et al.'s 40)", ge=1)
    lr_step_rate: float = setting(
        0.1, "with --lr-schedule step: the factor of each fall (Kim et al.'s 0.1)", gt=0, le=1)
    # Kim et al. decay their bias heads' lr with the network's.
    schedule_adversaries: bool = setting(
        False, "the lr schedule moves the bias heads' and critics' lr as well as g and f's")
    optimizer: str = setting(
        "adam", "optimiser of g and f and of the bias heads: adam, or sgd with --momentum "
                "(MINE's critic: --mine-optimizer)", choices=OPTIMIZERS)
    momentum: float = setting(0.9, "with --optimizer sgd: its momentum", ge=0, lt=1)
    weight_decay: float = setting(
        0.0, "L2 weight decay of the optimisers --optimizer names (Kim et al.'s 5e-4)", ge=0)
    sampler: str = setting(
        "method", "how an epoch's training rows are drawn: uniform = a shuffle of them all; "
                  "groups = group by group (every present (y, c) group of the benchmark "
                  "equally often: resampling, with lam 0 or any method); method = the "
                  "method's own (groups for group_dro at lam > 0, as published; uniform for "
                  "the others)", choices=SAMPLERS)
    model: str = setting(
        "benchmark", "g and f: the benchmark's own g with a linear f, or a network of another "
                     "protocol: kim_convnet (Kim et al.'s; z is its 32x14x14 feature map)",
        choices=("benchmark", *MODELS))
    input_norm: str = setting(
        "none", "the input as g reads it: as it is, or rounded to uint8 levels and normalised "
                "by a dataset's mean and std: cifar10 (what Kim et al. do on Colored MNIST)",
        choices=("none", *INPUT_NORMS))
    epochs: int | None = setting(None, "epochs per trial", ge=1)
    # Large for small inputs, small for images (a ResNet-50 batch of 4096 would not fit).
    eval_batch_size: int = setting(
        4096, "rows per forward pass when evaluating a whole split", ge=1)
    # A forward of all 60,000 full-MNIST rows cost 30% of an epoch (bench/epoch_cost.py).
    train_eval_rows: int = setting(
        0, "training rows train_acc, mi and mi_eval are measured on each epoch: a fixed "
           "random subset of this many (0 = every row)", ge=0)
    # Speed options (bench/RESULTS.md). `amp`: z, f, MINE and every loss stay fp32.
    # `compile`: in place, so state_dict keys do not change.
    amp: bool = setting(False, "bf16 autocast for the feature extractor (GPU; off by default)")
    compile: bool = setting(False, "torch.compile the feature extractor and T (off by default)")
    channels_last: bool = setting(False,
                                  "channels-last memory format for conv feature extractors")

    def problems(self) -> list[str]:
        """What is wrong with these values, one phrase each (empty when valid)."""
        problems = setting_problems(self)
        if self.lr_schedule != "constant" and self.epochs is None:
            problems.append(f"lr_schedule {self.lr_schedule!r} needs the trial's epochs "
                            f"(>= 1), got none")
        if not self.reads_map_z and map_channels(self.model):
            problems.append(f"model {self.model!r} gives a feature-map z, which this method "
                            f"reads as a vector (erm, and lntl with lntl_heads 'map', read "
                            f"maps)")
        if self.train_eval_rows == 1:
            problems.append(f"train_eval_rows must be 0 (every row) or >= 2, got "
                            f"{self.train_eval_rows}")
        return problems

    def validate(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass
class EpochStats:
    epoch: int
    loss_task: float
    penalty: float  # mean of the method's bias term over the epoch's batches
    time_s: float
    mi_batch: float = math.nan  # mi_backprop: mean L_ne seen by the theta steps
    guarded_frac: float = math.nan  # mi_backprop with mi_guard: theta steps with no MI step
    graphed: bool | None = None  # mi_backprop with cuda_graphs: steps replayed a CUDA graph


class ERM:
    """A method draws from `method_gen`, so the data order (`gen`) never depends on it."""

    name: ClassVar[str] = "erm"
    Config: ClassVar[type[TrainConfig]] = TrainConfig
    has_mi_estimator: ClassVar[bool] = False  # reports `mi` / `mi_batch` of its own
    own_sampler: ClassVar[str] = "uniform"  # what `sampler` "method" draws at lam > 0
    # A tuning budget's distributions; a method adds its own.
    search: ClassVar[dict[str, Space]] = {
        "lr": LogUniform(3e-4, 3e-3), "weight_decay": Choice((0.0, 1e-4, 1e-3, 1e-2))}

    def __init__(self, bench: Benchmark, cfg: TrainConfig, seed: int,
                 device: torch.device | str = "cpu"):
        self.cfg = cfg.validate()
        self.bench = bench
        self.device = torch.device(device)
        torch.manual_seed(seed)
        if cfg.model == "benchmark":
            g, f = bench.make_features(), None
        else:
            g, f = MODELS[cfg.model].build(bench.train.x.shape[1], bench.num_classes)
        self.g = g.to(self.device)
        if cfg.channels_last:
            self.g = self.g.to(memory_format=torch.channels_last)
            self.bench = bench = _channels_last(bench)  # once: x[idx] keeps the format
        if f is None:
            f = nn.Linear(bench.z_dim, bench.num_classes)
        self.f = f.to(self.device)
        self.input_norm = (None if cfg.input_norm == "none"
                           else InputNorm(*INPUT_NORMS[cfg.input_norm]).to(self.device))
        # Fused optimiser kernels: one call per step instead of several per tensor.
        self.fused = self.device.type in ("cpu", "cuda")
        self.lr = cfg.baseline_lr if cfg.lam == 0 and cfg.baseline_lr is not None else cfg.lr
        self.model_opt = self.optimizer([*self.g.parameters(), *self.f.parameters()], self.lr)
        if cfg.compile:
            # Methods that backpropagate twice through one graph (retain_graph=True) need
            # donated buffers off for compiled backwards (process-wide).
            torch._functorch.config.donated_buffer = False
            self.g.compile()
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.method_gen = torch.Generator(device=self.device).manual_seed(
            seed + METHOD_SEED_OFFSET)
        self.epoch = 0
        self.seed = seed
        # The training rows evaluate() measures (None: every row), fixed for the trial.
        self.eval_rows = train_eval_rows(len(bench.train), cfg.train_eval_rows, seed,
                                         self.device)
        # The last evaluate()'s training z, y and c, which mi_eval reuses.
        self.last_train: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # None: the epoch's rows shuffled from gen.
        self.batch_sampler: GroupSampler | None = None
        if self.sampler_name() == "groups":
            groups, count = bench.train_groups()
            self.batch_sampler = GroupSampler(groups.to(self.device), count)
        self.report_groups: dict[str, tuple[torch.Tensor, int]] = {}
        if bench.report_groups is not None:
            for split_name, split in bench.eval_splits.items():
                rows, count = bench.report_groups(split)
                self.report_groups[split_name] = (rows.to(self.device), count)

    def sampler_name(self) -> str:
        """At lam 0 every method is ERM, on ERM's shuffles."""
        if self.cfg.sampler != "method":
            return self.cfg.sampler
        return self.own_sampler if self.cfg.lam > 0 else "uniform"

    @contextlib.contextmanager
    def own_init(self) -> Iterator[None]:
        """A method's own modules initialised from its seed, leaving torch's global generator."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + METHOD_SEED_OFFSET)
            yield

    def optimizer(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        if self.cfg.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=self.cfg.momentum,
                                   weight_decay=self.cfg.weight_decay)
        if self.cfg.weight_decay:
            return torch.optim.Adam(params, lr=lr, weight_decay=self.cfg.weight_decay,
                                    fused=self.fused)
        return torch.optim.Adam(params, lr=lr, fused=self.fused)

    def eval_generator(self) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(
            self.seed + EVAL_SEED_OFFSET + self.epoch)

    def scheduled_optimizers(self) -> list[torch.optim.Optimizer]:
        adversaries = self.adversary_optimizers() if self.cfg.schedule_adversaries else []
        return [*self.model_optimizers(), *adversaries]

    def model_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.model_opt]

    def adversary_optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def lr_factor(self, step: int, steps_per_epoch: int) -> float:
        if self.cfg.lr_schedule == "constant":
            return 1.0
        if self.cfg.lr_schedule == "step":
            return self.cfg.lr_step_rate ** (self.epoch // self.cfg.lr_step_epochs)
        done = (self.epoch * steps_per_epoch + step) / (self.cfg.epochs * steps_per_epoch)
        return 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))

    def _set_lr(self, factor: float) -> None:
        for opt in self.scheduled_optimizers():
            for group in opt.param_groups:
                # The configured lr, recorded once (it travels in the optimiser's state dict).
                base = group.setdefault("base_lr", group["lr"])
                group["lr"] = base * factor

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_norm is not None:
            x = self.input_norm(x)
        if not self.cfg.amp:
            return self.g(x)
        # Without the weight cache: a CUDA graph captured inside would replay the bf16 copy
        # made at capture (each forward opens its own context, so the cache saved nothing).
        with torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False):
            return self.g(x).float()

    def epoch_order(self, n: int) -> torch.Tensor:
        if self.batch_sampler is not None:
            return self.batch_sampler.epoch(self.cfg.batch_size, self.method_gen)
        return permutation(n, self.gen, self.device)

    def start_epoch(self, order: torch.Tensor, train: Split) -> None:
        """Called before the first batch of every epoch with the epoch's row order."""

    def update(self, x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
               train: Split) -> tuple[torch.Tensor, torch.Tensor]:
        """One mini-batch. Returns detached (task loss, penalty): no device sync per step."""
        loss_task = F.cross_entropy(self.f(self._features(x)), y)
        self.model_step(loss_task)
        return loss_task.detach(), torch.zeros((), device=self.device)

    def model_step(self, loss: torch.Tensor) -> None:
        self.model_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.model_opt.step()

    def task_step(self, loss_task: torch.Tensor, penalty: Callable[[bool], torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of g and f on loss_task + lam * penalty(False). At lam = 0 the penalty is
        only measured, as penalty(True) (z detached) without gradient."""
        if self.cfg.lam == 0:
            self.model_step(loss_task)
            with torch.no_grad():
                return loss_task.detach(), penalty(True)
        value = penalty(False)
        self.model_step(loss_task + self.cfg.lam * value)
        return loss_task.detach(), value.detach()

    def run_epoch(self, train: Split | None = None) -> EpochStats:
        train = train if train is not None else self.bench.train
        self.last_train = None
        start = time.perf_counter()
        for module in self.modules().values():
            module.train()
        order = self.epoch_order(len(train))
        self.start_epoch(order, train)
        bs = self.cfg.batch_size
        steps_per_epoch = -(-len(train) // bs)
        losses, penalties = [], []
        for step, (x, y, c) in enumerate(train.batches(bs, order)):
            if len(y) < 2:  # a shuffle (and a batch statistic) needs two rows
                continue
            if self.cfg.lr_schedule != "constant":
                self._set_lr(self.lr_factor(step, steps_per_epoch))
            loss_task, penalty = self.update(x, y, c, order[step * bs:(step + 1) * bs], train)
            losses.append(loss_task)
            penalties.append(penalty)
        self.epoch += 1
        return self.epoch_stats(_mean_t(losses), _mean_t(penalties),
                                time.perf_counter() - start)

    def epoch_stats(self, loss_task: float, penalty: float, time_s: float) -> EpochStats:
        return EpochStats(self.epoch, loss_task, penalty, time_s)

    def modules(self) -> dict[str, nn.Module]:
        return {"g": self.g, "f": self.f}

    @torch.no_grad()
    def outputs(self, split: Split, rows: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        self.g.eval()
        self.f.eval()
        z = torch.cat([self._features(x) for x, _, _ in
                       split.batches(self.cfg.eval_batch_size, rows)])
        return z, self.f(z)

    def train_mi(self, z: torch.Tensor, c: torch.Tensor) -> float:
        """MI by the method's own estimator; NaN when it has none."""
        return math.nan

    def train_eval_set(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.last_train is None:
            self._train_logits()
        return self.last_train

    def _train_logits(self) -> torch.Tensor:
        """f's logits of the evaluated training rows; their z, y and c go to last_train."""
        train, rows = self.bench.train, self.eval_rows
        z, logits = self.outputs(train, rows)
        self.last_train = (z, rows_of(train.y, rows), rows_of(train.c, rows))
        return logits

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        pred = self._train_logits().argmax(1)
        z, y, c = self.last_train
        metrics = {"train_acc": _acc(pred, y), "mi": self.train_mi(z, c)}
        outs = {"train": SplitOutputs(pred, y, c)}
        for name, split in self.bench.eval_splits.items():
            _, logits_e = self.outputs(split)
            pred_e = logits_e.argmax(1)
            metrics[name] = _acc(pred_e, split.y)
            outs[name] = SplitOutputs(pred_e, split.y, split.c)
            if name in self.report_groups:
                metrics.update(worst_group(name, pred_e, split.y, *self.report_groups[name]))
        for fn in self.bench.extra_metrics:
            metrics.update(fn(outs))
        return metrics

    @contextlib.contextmanager
    def at_weights(self, g: dict, f: dict) -> Iterator[None]:
        """g and f at other weights for the duration, then back as they were."""
        saved = copy.deepcopy((self.g.state_dict(), self.f.state_dict()))
        last = self.last_train
        self.g.load_state_dict(g)
        self.f.load_state_dict(f)
        self.last_train = None
        try:
            yield
        finally:
            self.g.load_state_dict(saved[0])
            self.f.load_state_dict(saved[1])
            self.last_train = last

    @torch.no_grad()
    def predictions(self, z: torch.Tensor) -> torch.Tensor:
        """f's one-hot predictions of z: the stopping rule's floor (unbiased/stopping.py)."""
        logits = self.f(z)
        return torch.nn.functional.one_hot(logits.argmax(1), logits.shape[1]).float()

    def balanced_train_set(self, group_rows: int = 0, seed: int = 0
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(z, y, c, group-balanced weights) of every training row, not `train_eval_rows`'
        subset: the rare groups carry the balanced measure (Biased MNIST at rho .997: 180 of
        60,000) and a subset would keep a sixth of them. With `group_rows`, at most that
        many rows of each group."""
        groups, count = self.bench.train_groups()
        train = self.bench.train
        if group_rows <= 0:
            return self.train_features(), train.y, train.c, balanced_weights(
                groups, count).to(self.device)
        rows = capped_group_rows(groups, group_rows, seed)
        return self.outputs(train, rows)[0], train.y[rows], train.c[rows], balanced_weights(
            groups[rows], count).to(self.device)

    def train_features(self) -> torch.Tensor:
        return self.outputs(self.bench.train)[0]

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return copy.deepcopy({
            "method": self.name, "epoch": self.epoch, "seed": self.seed,
            "g": self.g.state_dict(),
            "f": self.f.state_dict(), "model_opt": self.model_opt.state_dict(),
            "gen": self.gen.get_state(), "method_gen": self.method_gen.get_state(),
            "rng_device": self.device.type, "torch_rng": torch.get_rng_state(),
            "cfg": asdict(self.cfg), **self.extra_state()})

    def warm_start(self, state: dict) -> None:
        """g, f and their optimiser's state from another trial's checkpoint; the rest stays."""
        self.g.load_state_dict(state["g"])
        self.f.load_state_dict(state["f"])
        self.model_opt.load_state_dict(state["model_opt"])
        for group in self.model_opt.param_groups:
            group["lr"] = self.lr
            group.pop("base_lr", None)  # the schedule records this trial's on its first step

    def load_state_dict(self, state: dict) -> list[str]:
        """Restore a checkpoint written on any device; returns notes on what was re-seeded."""
        self.g.load_state_dict(state["g"])
        self.f.load_state_dict(state["f"])
        self.model_opt.load_state_dict(state["model_opt"])
        self.load_extra_state(state)
        if "seed" in state:  # the seed of the evaluation subset and shuffles
            self.seed = int(state["seed"])
            self.eval_rows = train_eval_rows(len(self.bench.train), self.cfg.train_eval_rows,
                                             self.seed, self.device)
        self.epoch = int(state["epoch"])
        notes = []
        streams = [("gen", self.gen, self.seed)]
        if "method_gen" in state:  # absent from checkpoints written before it existed
            streams.append(("method_gen", self.method_gen, self.seed + METHOD_SEED_OFFSET))
        for key, gen, seed in streams:
            saved = _cpu_bytes(state[key])  # set_state takes a CPU ByteTensor only
            if saved is not None and saved.numel() == gen.get_state().numel() and state.get(
                    "rng_device", self.device.type) == self.device.type:
                gen.set_state(saved)
            else:
                gen.manual_seed(seed + RESEED_EPOCH_STRIDE * self.epoch)
                notes.append(f"{key}: the checkpoint's generator state is from a "
                             f"{state.get('rng_device', 'different')} device, this trial runs "
                             f"on {self.device.type}: re-seeded from the seed and epoch "
                             f"{self.epoch}")
        torch_rng = _cpu_bytes(state["torch_rng"])
        if torch_rng is None:
            torch.manual_seed(self.seed + RESEED_EPOCH_STRIDE * self.epoch)
            notes.append(f"torch_rng: unreadable in the checkpoint: re-seeded from the seed "
                         f"and epoch {self.epoch}")
        else:
            torch.set_rng_state(torch_rng)
        return notes


class BiasHead(nn.Module):
    """h(z): logits of the bias attribute's classes, one group per head."""

    def __init__(self, z_dim: int, classes: tuple[int, ...], hidden: int = 64):
        super().__init__()
        if not classes:
            raise ValueError("this benchmark has no bias classes (Benchmark.bias_classes) for "
                             "a bias head")
        self.classes = tuple(classes)
        layers: list[nn.Module] = [nn.Linear(z_dim, hidden), nn.ReLU()] if hidden else []
        layers.append(nn.Linear(hidden or z_dim, sum(self.classes)))
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> list[torch.Tensor]:
        return list(self.net(z).split(self.classes, dim=1))


def bias_cross_entropy(logits: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    return torch.stack([F.cross_entropy(lg, targets[:, i])
                        for i, lg in enumerate(logits)]).mean()


def train_eval_rows(n_train: int, rows: int, seed: int, device: torch.device
                    ) -> torch.Tensor | None:
    """`rows` sorted training rows drawn from `seed`, or None (every row)."""
    if rows == 0 or rows >= n_train:
        return None
    gen = torch.Generator().manual_seed(seed + EVAL_ROWS_SEED_OFFSET)
    return torch.randperm(n_train, generator=gen)[:rows].sort().values.to(device)


def worst_group(split: str, pred: torch.Tensor, y: torch.Tensor, groups: torch.Tensor,
                count: int) -> dict[str, float]:
    """The worst present group's accuracy; on the validation split also the groups present
    and the smallest one's rows (a worst group of a few rows is a noisy pick)."""
    accs, sizes = group_accuracies(pred, y, groups, count)
    present = sizes > 0
    out = {split.removesuffix("_acc") + "_worst_acc": float(accs[present].min())}
    if split == VAL_SPLIT:
        out.update(val_groups=int(present.sum()), val_min_group=int(sizes[present].min()))
    return out


def _cpu_bytes(state: torch.Tensor) -> torch.Tensor | None:
    """An RNG state as the CPU byte tensor set_state takes; None when unreadable here."""
    try:
        return state.to("cpu", torch.uint8)
    except (RuntimeError, NotImplementedError):
        return None


def rows_of(values: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    return values if rows is None else values[rows]


def _acc(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float((pred == y).float().mean())


def _mean_t(values: list[torch.Tensor]) -> float:
    return float(torch.stack(values).double().mean()) if values else float("nan")


def _channels_last(bench: Benchmark) -> Benchmark:
    def convert(split: Split) -> Split:
        if not isinstance(split, TensorSplit) or split.x.dim() != 4:
            return split
        return TensorSplit(split.x.contiguous(memory_format=torch.channels_last), split.y,
                           split.c)
    return dataclasses.replace(bench, train=convert(bench.train),
                               eval_splits={k: convert(v) for k, v in bench.eval_splits.items()})
