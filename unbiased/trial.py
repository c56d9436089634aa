"""A trial: where each of its per-epoch rows comes from (nothing here imports Ray).

`run_trial` reports one row of metrics per epoch, with a checkpoint, to its session
(`TrialSession`); a restart continues from the session's checkpoint. A checkpoint is one
state per member (a plain trial has one, ""), made files here so that `ckpt_s` counts the
writing and every session stores the same bytes.

A trial bundle (`--bundle N`, `run_bundle`) trains several mi_backprop grid points as one
trial; everything after an epoch's training is as in run_trial, per member, reported under
"m<i>/". A member that diverges reports it once and is frozen, the others go on.
"""

from __future__ import annotations

import io
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from unbiased.data import Benchmark, hold_out
from unbiased.methods import DEFAULT_METHOD, EpochStats, make_method
from unbiased.methods.bundle import MIBackpropBundle
from unbiased.mine import mi_eval
from unbiased.settings import (
    MEMBERS_KEY,
    WARM_FROM,
    TrialSettings,
    flat_config,
    flat_point,
    member_key,
    trial_rule_problems,
)
from unbiased.stopping import (
    CRITERION,
    SELECT_EPOCH_RULES,
    EstimatedEpoch,
    could_be_picked,
    pick_epoch,
)

# The seed of the selected epoch's second estimate is the trial seed plus this.
REESTIMATE_SEED_OFFSET = 7_919
# A plain trial's checkpoint file; a bundle member's is state_<member>.pt.
CHECKPOINT_FILE = "state.pt"


class TrialSession(Protocol):
    def restore(self) -> dict[str, bytes] | None:
        """The files of the last checkpoint (None: a fresh start)."""

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        """One report (an epoch, or a trial's end), with a checkpoint's files."""

    def where(self) -> dict[str, str]:
        """The node and machine columns of every epoch."""

    def gpu_ids(self) -> list:
        """The GPUs the runner gave this trial (empty: none)."""

    def checkpoint_of(self, key: str) -> dict[str, bytes] | None:
        """Another trial's last checkpoint in this sweep, by its key (None: it has none)."""


def checkpoint_files(states: dict[str, dict]) -> dict[str, bytes]:
    files = {}
    for member, state in states.items():
        buffer = io.BytesIO()
        torch.save(state, buffer)
        files[CHECKPOINT_FILE if member == "" else f"state_{member}.pt"] = buffer.getvalue()
    return files


def read_checkpoint(files: dict[str, bytes]) -> dict[str, dict]:
    """The states of a checkpoint's files, by member. On the CPU: RNG states must stay CPU
    byte tensors; load_state_dict copies the rest onto the trial's device."""
    states = {}
    for name, data in files.items():
        if name == CHECKPOINT_FILE:
            member = ""
        elif name.startswith("state_") and name.endswith(".pt"):
            member = name[len("state_"):-len(".pt")]
        else:
            continue
        states[member] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return states


def machine_id() -> str:
    """/etc/machine-id's first 12 characters, else the hostname: hostnames repeat (every
    development machine here is `vm`), and per-epoch numbers differ across machines."""
    try:
        with open("/etc/machine-id") as f:
            return f.read().strip()[:12] or socket.gethostname()
    except OSError:
        return socket.gethostname()


class MemorySession:
    """Reports and the last checkpoint kept in memory (the tests' session)."""

    def __init__(self, checkpoint: dict[str, bytes] | None = None,
                 gpus: list | None = None,
                 others: dict[str, dict[str, bytes]] | None = None) -> None:
        self.checkpoint = checkpoint
        self.reports: list[dict] = []
        self.checkpoints = 0  # reports that came with a checkpoint
        self.gpus = gpus or []
        self.others = others or {}  # other trials' last checkpoints, by key

    def restore(self) -> dict[str, bytes] | None:
        return None if self.checkpoint is None else dict(self.checkpoint)

    def report(self, metrics: dict, checkpoint: dict[str, bytes] | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint is not None:
            self.checkpoint = dict(checkpoint)
            self.checkpoints += 1

    def where(self) -> dict[str, str]:
        return {"node": socket.gethostname(), "node_id": "local", "machine": machine_id()}

    def gpu_ids(self) -> list:
        return list(self.gpus)

    def checkpoint_of(self, key: str) -> dict[str, bytes] | None:
        files = self.others.get(key)
        return None if files is None else dict(files)


class InjectedFailure(RuntimeError):
    """Raised by the `fail_once_at_epoch` test hook."""


def divergence(metrics: dict, keys: tuple[str, ...]) -> str | None:
    """Why the epoch diverged (NaN or inf among `keys`), or None."""
    bad = [key for key in keys
           if isinstance(metrics.get(key), float) and not math.isfinite(metrics[key])]
    if not bad:
        return None
    return (f"diverged at epoch {metrics['epoch']}: "
            + ", ".join(f"{k}={metrics[k]}" for k in bad))


class DeviceError(RuntimeError):
    """A configuration fault, not a lost node: the trial stops once instead of retrying."""


def torch_build() -> str:
    cuda = torch.version.cuda
    return (f"torch {torch.__version__} ({'CUDA ' + cuda + ' build' if cuda else 'CPU-only build'}"
            f"), torch.cuda.is_available() = {torch.cuda.is_available()}, "
            f"{torch.cuda.device_count() if cuda else 0} CUDA devices visible, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")


def pick_device(requested: str, gpu_ids: list | None = None) -> torch.device:
    """`auto` is cuda when Ray gave the trial GPUs or, outside Ray, when CUDA is available. A
    GPU torch cannot see is a DeviceError: training on one CPU thread would go unnoticed."""
    wants_cuda = requested.startswith("cuda") or (requested == "auto" and bool(gpu_ids))
    if wants_cuda and not torch.cuda.is_available():
        given = f"GPUs {list(gpu_ids)} from Ray" if gpu_ids else "no GPU from Ray"
        raise DeviceError(f"device {requested!r} with {given}, but {torch_build()}")
    device = torch.device(requested if requested != "auto"
                          else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        # CUDA can be "available" and still not start on a device (a build without kernels
        # for it, a device in another process's exclusive mode): a small tensor tells.
        try:
            float(torch.ones(2, device=device).sum())
        except (RuntimeError, AssertionError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DeviceError(f"device {requested!r}: CUDA cannot start on {device} "
                              f"({first}); {torch_build()}") from None
    return device


def set_deterministic(device: torch.device) -> None:
    """--deterministic: the same numbers on one GPU model, as on CPU. No TF32: it rounds
    matmuls and convolutions to 10-bit mantissas."""
    if device.type == "cuda":
        # cuBLAS needs a fixed workspace to be deterministic; read when it first starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # An op without a deterministic kernel warns instead of ending the trial (none of the
    # digits methods' ops is one).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# The values a trial takes for settings its config lacks.
_TRIAL = TrialSettings()


@dataclass(frozen=True)
class Plan:
    """What a trial does, read from its config once."""

    epochs: int
    seed: int
    method: str
    select: str  # one of SELECT_EPOCH_RULES
    mi_steps: int
    every: int  # MI re-estimated every `every` epochs and at the last
    fail_at: int | None  # the fail_once_at_epoch test hook
    cuda_graphs: bool = False  # the fresh critics' steps replayed as CUDA graphs too
    balanced: bool = False  # mi_eval_weights groups: the fresh estimates group-balanced
    warm_from: str | None = None  # the key of the trial a warm start starts from
    val_frac: float = 0.0  # the training rows held out as a validation split (0: none)
    group_rows: int = 0  # the balanced estimates' rows of each group (0: every row)

    @classmethod
    def of(cls, config: dict) -> Plan:
        select = str(config.get("select_epoch", _TRIAL.select_epoch))
        if select not in SELECT_EPOCH_RULES:
            raise ValueError(f"select_epoch must be one of {SELECT_EPOCH_RULES}, got {select!r}")
        fail_at = config.get("fail_once_at_epoch")
        return cls(epochs=int(config["epochs"]), seed=int(config["seed"]),
                   method=str(config.get("method", DEFAULT_METHOD)), select=select,
                   mi_steps=int(config.get("mi_eval_steps", _TRIAL.mi_eval_steps)),
                   every=int(config.get("mi_eval_every", _TRIAL.mi_eval_every)),
                   fail_at=None if fail_at is None else int(fail_at),
                   cuda_graphs=bool(config.get("cuda_graphs", False)),
                   balanced=str(config.get("mi_eval_weights", _TRIAL.mi_eval_weights))
                   == "groups",
                   warm_from=None if config.get(WARM_FROM) is None
                   else str(config[WARM_FROM]),
                   val_frac=float(config.get("val_frac", _TRIAL.val_frac)),
                   group_rows=int(config.get("mi_eval_group_rows",
                                             _TRIAL.mi_eval_group_rows)))

    def benchmark(self, build: Callable[[dict], Benchmark], config: dict,
                  device: torch.device) -> Benchmark:
        bench = build(config).to(device)
        return hold_out(bench, self.val_frac, self.seed) if self.val_frac > 0 else bench

    def for_lam(self, lam: float) -> Plan:
        """lam = 0 (ERM) is reported at its last epoch: the stopping rule would pick early
        epochs whose lower MI only reflects a less fitted model."""
        return replace(self, select="last") if lam == 0 else self

    @property
    def stopping(self) -> bool:
        return self.select in CRITERION

    @property
    def criterion(self) -> str:
        return CRITERION.get(self.select, "mi_eval")

    def estimates_at(self, epoch: int) -> bool:
        return epoch == self.epochs or (self.stopping and epoch % self.every == 0)


class EpochPicker:
    """The lowest-MI rule's records and the weights it could still pick, in every checkpoint."""

    def __init__(self, criterion: str, state: dict | None) -> None:
        self.criterion = criterion
        state = state or {}
        self.records = [EstimatedEpoch(**r) for r in state.get("records", [])]
        self.kept: dict[int, dict] = dict(state.get("kept", {}))

    def add(self, epoch: int, metrics: dict, state: dict) -> None:
        self.records.append(EstimatedEpoch(
            epoch, float(metrics["train_acc"]), float(metrics["mi_eval"]),
            float(metrics["mi_eval_cond"]), float(metrics["mi_floor"]),
            float(metrics["mi_floor_cond"])))
        self.kept[epoch] = {"g": state["g"], "f": state["f"]}
        keep = could_be_picked(self.records, self.criterion)
        self.kept = {e: w for e, w in self.kept.items() if e in keep}

    def store(self, state: dict) -> None:
        state["records"] = [vars(r) for r in self.records]
        state["kept"] = self.kept

    def pick(self) -> int | None:
        return pick_epoch(self.records, criterion=self.criterion)

    def weights(self, epoch: int, state: dict) -> dict:
        """The g and f of a picked epoch (this epoch's, in `state`, when not kept)."""
        return self.kept.get(epoch) or {"g": state["g"], "f": state["f"]}


def restore(algo, session: TrialSession) -> dict | None:
    files = session.restore()
    if files is None:
        return None
    state = read_checkpoint(files)[""]
    for note in algo.load_state_dict(state):
        print(f"restore: {note}", flush=True)
    return state


class WarmStartError(RuntimeError):
    pass


def warm_start(algo, session: TrialSession, source: str) -> None:
    """g, f and their optimiser's state from the last checkpoint of trial `source`."""
    files = session.checkpoint_of(source)
    if files is None:
        raise WarmStartError(f"warm start: trial {source} (the lam = 0 trial this one "
                             f"starts from) left no checkpoint: it failed or diverged")
    state = read_checkpoint(files)[""]
    algo.warm_start(state)
    print(f"warm start from trial {source} at its epoch {int(state['epoch'])}", flush=True)


def train_epoch(algo, epoch: int, start_epoch: int, where: dict[str, str],
                stats: EpochStats | None = None) -> dict:
    """One epoch trained (unless a bundle gives its `stats`) and evaluated; mi_eval NaN until
    estimated. Wall seconds: time_s + eval_s + mi_eval_s + ckpt_s <= epoch_s."""
    stats = algo.run_epoch() if stats is None else stats
    eval_start = time.perf_counter()
    evaluated = algo.evaluate()
    eval_s = time.perf_counter() - eval_start
    metrics: dict[str, float | int | str] = {
        "epoch": epoch, "loss_task": stats.loss_task, "penalty": stats.penalty,
        "mi_batch": stats.mi_batch, "time_s": stats.time_s, **evaluated,
        "start_epoch": start_epoch, **where, "mi_eval": math.nan,
        "eval_s": eval_s, "mi_eval_s": 0.0,
    }
    if math.isfinite(stats.guarded_frac):
        metrics["guarded_frac"] = stats.guarded_frac
    if stats.graphed is not None:
        metrics["graphed"] = stats.graphed
    return metrics


def mi_eval_set(algo, plan: Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                           torch.Tensor | None]:
    if plan.balanced:
        return algo.balanced_train_set(plan.group_rows, plan.seed)
    return (*algo.train_eval_set(), None)


def mi_pair(z: torch.Tensor, c: torch.Tensor, y: torch.Tensor, seed: int, plan: Plan,
            weights: torch.Tensor | None) -> tuple[float, float]:
    """I(z; c) and I(z; c | y) (mi_eval's `given`)."""
    return tuple(mi_eval(z, c, seed=seed, steps=plan.mi_steps, given=given,
                         cuda_graphs=plan.cuda_graphs, weights=weights) for given in (None, y))


def fresh_estimates(algo, plan: Plan) -> dict[str, float]:
    z, y, c, weights = mi_eval_set(algo, plan)
    estimates = dict(zip(("mi_eval", "mi_eval_cond"), mi_pair(z, c, y, plan.seed, plan,
                                                                weights), strict=True))
    if plan.stopping:
        # The same estimators on the model's own predictions: floors that an estimate on z
        # reads below only when the estimator fails on z (unbiased/stopping.py).
        floors = mi_pair(algo.predictions(z), c, y, plan.seed, plan, weights)
        estimates.update(zip(("mi_floor", "mi_floor_cond"), floors, strict=True))
    return estimates


def select_epoch(algo, plan: Plan, rule: EpochPicker | None, state: dict,
                 metrics: dict) -> float:
    """At the last epoch: `selected_epoch`; returns the seconds spent re-estimating."""
    epoch = int(metrics["epoch"])
    chosen = rule.pick() if rule is not None else epoch
    if chosen is None:
        # No epoch with a usable estimate (NaN, or below its floor): report the last.
        chosen = epoch
        metrics["selection_note"] = (f"no epoch with a usable {plan.criterion} (NaN or "
                                     f"below its prediction floor): last epoch")
    metrics["selected_epoch"] = chosen
    if rule is None:
        return 0.0
    weights = rule.weights(chosen, state)
    state["selected"] = {"epoch": chosen, **weights}
    # The chosen epoch's estimates again, with another seed (T's init, batches and 80/20
    # split): the minimum of noisy estimates is biased low, this is not.
    again_start = time.perf_counter()
    with algo.at_weights(weights["g"], weights["f"]):
        z, y, c, weights = mi_eval_set(algo, plan)
        metrics["selected_mi_eval"], metrics["selected_mi_eval_cond"] = mi_pair(
            z, c, y, plan.seed + REESTIMATE_SEED_OFFSET, plan, weights)
    again_s = time.perf_counter() - again_start
    metrics["mi_eval_s"] = float(metrics["mi_eval_s"]) + again_s
    return again_s


def start_trial(config: dict, session: TrialSession
                ) -> tuple[dict, torch.device | None]:
    """The flat config and the device (None: reported unusable)."""
    config = flat_config(config)
    # Side-by-side trials must not oversubscribe the cores they were given.
    torch.set_num_threads(max(1, int(config.get("num_threads", 1))))
    # Weights and Adam moments of units that stop learning decay into float32's subnormal
    # range, where CPU arithmetic runs many times slower: ERM-like trials on Biased MNIST
    # spent three quarters of their hours there. Flushed to zero they add nothing a float32
    # sum could hold, so the metrics stay the same
    # (docs/MEASURED.md, "Subnormal weights: late epochs on CPU").
    torch.set_flush_denormal(True)
    problems = trial_rule_problems(config)
    if problems:
        raise ValueError("; ".join(problems))
    try:
        device = pick_device(str(config.get("device", _TRIAL.device)), session.gpu_ids())
    except DeviceError as exc:
        # Reported, not raised: Tune would retry a raised error max_failures times.
        print(f"error: {exc}", flush=True)
        session.report({"epoch": 0, "device_error": str(exc), "node": socket.gethostname()})
        device = None
    if device is not None and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bool(config.get("tf32", _TRIAL.tf32))
    if device is not None and config.get("deterministic"):
        set_deterministic(device)
    return config, device


def precision(config: dict, device: torch.device) -> str:
    """`bf16-g`, `tf32-matmul`, `tf32-conv` (cuDNN's GPU default) joined by +, else `fp32`."""
    parts = ["bf16-g"] if config.get("amp") else []
    if device.type == "cuda":
        parts += ["tf32-matmul"] if torch.backends.cuda.matmul.allow_tf32 else []
        parts += ["tf32-conv"] if torch.backends.cudnn.allow_tf32 else []
    return "+".join(parts) or "fp32"


def run_trial(config: dict, build: Callable[[dict], Benchmark], session: TrialSession) -> None:
    """Train one trial; `build(config)` returns the benchmark (on CPU)."""
    config, device = start_trial(config, session)
    if device is None:
        return
    config = {**config, "device": str(device)}  # the build puts its tensors there too
    plan = Plan.of(config)
    algo = make_method(plan.method, plan.benchmark(build, config, device), config,
                       seed=plan.seed, device=device)
    plan = plan.for_lam(algo.cfg.lam)
    # A method without an MI estimator of its own reports mi and mi_batch as NaN.
    watched = ("loss_task", "penalty") + (("mi_batch", "mi") if algo.has_mi_estimator else ())
    restored = restore(algo, session)
    if restored is None and plan.warm_from is not None:
        warm_start(algo, session, plan.warm_from)
    rule = EpochPicker(plan.criterion, restored) if plan.stopping else None
    start_epoch = algo.epoch + 1
    where = {**session.where(), "precision": precision(config, device)}

    for epoch in range(start_epoch, plan.epochs + 1):
        if epoch == plan.fail_at and restored is None:
            raise InjectedFailure(f"injected failure at epoch {epoch} (fail_once_at_epoch)")
        epoch_start = time.perf_counter()
        metrics = train_epoch(algo, epoch, start_epoch, where)
        state, ckpt_start = close_epoch(algo, plan, rule, metrics, watched)
        if state is None:
            # No checkpoint: a NaN model is not worth resuming.
            metrics["epoch_s"] = time.perf_counter() - epoch_start
            session.report(metrics)
            return
        files = checkpoint_files({"": state})
        now = time.perf_counter()
        metrics["ckpt_s"] = now - ckpt_start
        metrics["epoch_s"] = now - epoch_start
        session.report(metrics, files)


def close_epoch(algo, plan: Plan, rule: EpochPicker | None, metrics: dict,
                watched: tuple[str, ...]) -> tuple[dict | None, float]:
    """Divergence, MI estimates, the stopping rule; returns the state, when ckpt_s began."""
    diverged = divergence(metrics, watched)
    if diverged:
        metrics["diverged"] = diverged
        return None, time.perf_counter()
    epoch = int(metrics["epoch"])
    estimated = plan.estimates_at(epoch)
    if estimated:
        mi_start = time.perf_counter()
        metrics.update(fresh_estimates(algo, plan))
        metrics["mi_eval_s"] = time.perf_counter() - mi_start
    ckpt_start = time.perf_counter()
    state = algo.state_dict()
    if rule is not None:
        if estimated:
            rule.add(epoch, metrics, state)
        rule.store(state)
    if epoch == plan.epochs:
        # mi_eval's seconds, not the checkpoint's: ckpt_s starts after them.
        ckpt_start += select_epoch(algo, plan, rule, state, metrics)
    return state, ckpt_start


WATCHED = ("loss_task", "penalty", "mi_batch", "mi")


def member_configs(config: dict) -> list[dict]:
    shared = {k: v for k, v in config.items() if k != MEMBERS_KEY}
    return [{**shared, **flat_point(point)} for point in config[MEMBERS_KEY]]


def run_bundle(config: dict, build: Callable[[dict], Benchmark], session: TrialSession) -> None:
    config, device = start_trial(config, session)
    if device is None:
        return
    configs = [{**c, "device": str(device)} for c in member_configs(config)]
    plans = [Plan.of(c) for c in configs]
    algos = [make_method(p.method, p.benchmark(build, c, device), c, seed=p.seed,
                         device=device)
             for p, c in zip(plans, configs, strict=True)]
    plans = [p.for_lam(a.cfg.lam) for p, a in zip(plans, algos, strict=True)]
    keys = [member_key(i) for i in range(len(algos))]

    files = session.restore()
    states = read_checkpoint(files) if files is not None else {}
    diverged = {key: states[key]["diverged"] for key in keys
                if "diverged" in states.get(key, {})}
    for key, algo in zip(keys, algos, strict=True):
        if key in states and key not in diverged:
            for note in algo.load_state_dict(states[key]):
                print(f"restore {key}: {note}", flush=True)
    reached = max((a.epoch for a in algos), default=0)
    for key in diverged:
        algos[keys.index(key)].epoch = reached  # frozen where it was; it keeps the others' step
    rules = [EpochPicker(p.criterion, states.get(k)) if p.stopping else None
             for p, k in zip(plans, keys, strict=True)]
    # On a GPU the critic's shuffles of all members come in one draw a step (unbiased/
    # methods/bundle.py, DRAWS); on a CPU each member draws its own, as its run alone.
    bundle = MIBackpropBundle(algos, draws="batched" if device.type == "cuda" else "exact")
    for i, key in enumerate(keys):
        if key in diverged:
            bundle.freeze(i)
    start_epoch = reached + 1
    where = {**session.where(), "precision": precision(config, device)}
    fail_at = plans[0].fail_at

    for epoch in range(start_epoch, plans[0].epochs + 1):
        if epoch == fail_at and not states:
            raise InjectedFailure(f"injected failure at epoch {epoch} (fail_once_at_epoch)")
        epoch_start = time.perf_counter()
        stats = bundle.run_epoch()
        report: dict = {"epoch": epoch}
        kept: dict[str, dict] = {}
        ckpt_start = None
        for i, key in enumerate(keys):
            if key not in diverged:
                metrics = train_epoch(algos[i], epoch, start_epoch, where, stats=stats[i])
                state, started = close_epoch(algos[i], plans[i], rules[i], metrics, WATCHED)
                if state is None:  # this member diverged: frozen from here on
                    diverged[key] = str(metrics["diverged"])
                    bundle.freeze(i)
                else:
                    kept[key] = state
                    ckpt_start = started if ckpt_start is None else min(ckpt_start, started)
                report.update({f"{key}/{k}": v for k, v in metrics.items()})
            if key in diverged:
                kept[key] = {"diverged": diverged[key], "epoch": epoch}
        checkpoint = checkpoint_files(kept)
        now = time.perf_counter()
        report["ckpt_s"] = now - (ckpt_start if ckpt_start is not None else now)
        report["epoch_s"] = now - epoch_start
        for key in keys:
            if f"{key}/epoch" in report:
                report[f"{key}/ckpt_s"] = report["ckpt_s"]
                report[f"{key}/epoch_s"] = report["epoch_s"]
        if len(diverged) == len(keys):
            report["diverged"] = "every member diverged"  # the trial ends here
        session.report(report, checkpoint)
        if len(diverged) == len(keys):
            return
