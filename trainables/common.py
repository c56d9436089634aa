"""The benchmark-independent part of a Tune function trainable.

`run_trial` trains the config's `method` (unbiased.methods.METHODS, default mi_backprop) for
`epochs` epochs on a built benchmark, reports once per epoch
with a checkpoint, and on a restart continues from `tune.get_checkpoint()` at the next epoch
with the model, MINE, optimiser and RNG states it had. The final report also carries
`mi_eval`: MI measured by a fresh statistics network trained on the frozen training features,
`mi_eval_cond` (the same with c shuffled within each label) and `selected_epoch`: the last
epoch, or with `select_epoch = "lowest_mi"` the epoch the label-free lowest-MI rule picks over
the run (mi_eval is then measured every epoch; the final checkpoint holds that epoch's g and f
under "selected").
"""

from __future__ import annotations

import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable

import ray
import torch
from ray import tune

from unbiased.data import Benchmark
from unbiased.methods import DEFAULT_METHOD, make_method
from unbiased.stopping import (
    CRITERION,
    SELECT_EPOCH_RULES,
    EpochRecord,
    could_be_picked,
    pick_epoch,
)
from unbiased.train import mi_eval

CHECKPOINT_FILE = "state.pt"
# The seed of the selected epoch's second estimate is the trial seed plus this.
REESTIMATE_SEED_OFFSET = 7_919


class InjectedFailure(RuntimeError):
    """Raised by the `fail_once_at_epoch` test hook."""


def divergence(metrics: dict, keys: tuple[str, ...] = ("loss_task", "penalty", "mi_batch",
                                                      "mi")) -> str | None:
    """Why a trial's epoch metrics mean it diverged (NaN or inf among `keys`), or None."""
    bad = [key for key in keys
           if isinstance(metrics.get(key), float) and not math.isfinite(metrics[key])]
    if not bad:
        return None
    return (f"diverged at epoch {metrics['epoch']}: "
            + ", ".join(f"{k}={metrics[k]}" for k in bad))


def machine_id() -> str:
    """Which machine ran an epoch, across sessions and Ray restarts (hostnames repeat: every
    development machine here is `vm`): /etc/machine-id's first 12 characters, else the
    hostname. Per-epoch numbers differ across machines (docs/MEASURED.md), so comparisons
    are made within one."""
    try:
        with open("/etc/machine-id") as f:
            return f.read().strip()[:12] or socket.gethostname()
    except OSError:
        return socket.gethostname()


class DeviceError(RuntimeError):
    """A trial was given a device it cannot use: a configuration fault, not a lost node, so
    the trial stops once instead of being retried."""


def torch_build() -> str:
    """What torch sees and was built for, for a device error."""
    cuda = torch.version.cuda
    return (f"torch {torch.__version__} ({'CUDA ' + cuda + ' build' if cuda else 'CPU-only build'}"
            f"), torch.cuda.is_available() = {torch.cuda.is_available()}, "
            f"{torch.cuda.device_count() if cuda else 0} CUDA devices visible, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")


def pick_device(requested: str, gpu_ids: list | None = None) -> torch.device:
    """The trial's device. `auto` is cuda when the trial was given GPUs (`gpu_ids`, what Ray
    assigned it) or, outside Ray, when CUDA is available. A trial given a GPU (or `cuda`) that
    torch cannot see is a DeviceError: training on one CPU thread instead would go unnoticed."""
    wants_cuda = requested.startswith("cuda") or (requested == "auto" and bool(gpu_ids))
    if wants_cuda and not torch.cuda.is_available():
        given = f"GPUs {list(gpu_ids)} from Ray" if gpu_ids else "no GPU from Ray"
        raise DeviceError(f"device {requested!r} with {given}, but {torch_build()}")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def trial_gpu_ids() -> list:
    """The GPUs Ray gave this trial (empty outside a Ray worker or without GPUs)."""
    try:
        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - outside a worker Ray may refuse; then there are none
        return []


def set_deterministic(device: torch.device) -> None:
    """--deterministic: the same config and seed give the same numbers on one GPU model, as
    they do on CPU: deterministic cuDNN and algorithms (an op without one warns), no TF32 (it
    rounds matmuls and convolutions to 10-bit mantissas), no cuDNN autotuning."""
    if device.type == "cuda":
        # cuBLAS needs a fixed workspace to be deterministic; read when it first starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an op without a deterministic kernel warns (in the trial's log) instead of
    # ending the trial; none of the digits methods' ops is one on CPU or CUDA.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def run_trial(config: dict, build: Callable[[dict], Benchmark]) -> None:
    """Train one trial under Tune. `build(config)` returns the benchmark (on CPU)."""
    # Tune logs every checkpoint at INFO from the worker; the driver prints progress itself.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    # A sweep's trial has its grid point under "point" (sweeps/core.py).
    config = {**{k: v for k, v in config.items() if k != "point"}, **(config.get("point") or {})}
    # Side-by-side trials must not oversubscribe the cores they were given.
    torch.set_num_threads(max(1, int(config.get("num_threads", 1))))
    try:
        device = pick_device(str(config.get("device", "auto")), trial_gpu_ids())
    except DeviceError as exc:
        # Reported, not raised: Tune would retry a raised error max_failures times.
        print(f"error: {exc}", flush=True)
        tune.report({"epoch": 0, "device_error": str(exc), "node": socket.gethostname()})
        return
    config = {**config, "device": str(device)}  # the build puts its tensors there too
    if config.get("deterministic"):
        set_deterministic(device)
    epochs = int(config["epochs"])
    seed = int(config["seed"])
    select = str(config.get("select_epoch", "last"))
    if select not in SELECT_EPOCH_RULES:
        raise ValueError(f"select_epoch must be one of {SELECT_EPOCH_RULES}, got {select!r}")
    mi_steps = int(config.get("mi_eval_steps", 2000))
    # The stopping rule re-estimates MI every `mi_eval_every` epochs and at the last, and
    # picks among those epochs: on a long schedule a re-estimate every epoch would cost more
    # than the training (docs/MEASURED.md, "The GPU path on an H200").
    every = int(config.get("mi_eval_every", 1))
    method = str(config.get("method", DEFAULT_METHOD))
    bench = build(config).to(device)
    algo = make_method(method, bench, config, seed=seed, device=device)
    # lam as the method reads it (its Config's default when the trial config has none).
    if algo.cfg.lam == 0:
        # lam = 0 is the ERM baseline: reported at its last epoch, as a user would train it
        # (the stopping rule is part of the method, and on ERM it would pick early epochs
        # whose lower MI only reflects a less fitted model).
        select = "last"
    stopping = select in CRITERION  # a label-free stopping rule over the epochs
    criterion = CRITERION.get(select, "mi_eval")
    # A method without an MI estimator of its own reports mi and mi_batch as NaN.
    watched = ("loss_task", "penalty") + (("mi_batch", "mi") if algo.has_mi_estimator else ())

    checkpoint = tune.get_checkpoint()
    resumed = checkpoint is not None
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            # On the CPU: RNG states must stay CPU byte tensors (map_location=cuda moved them
            # onto the GPU, and every restore on a GPU crashed); load_state_dict copies the
            # weights and optimiser states onto the trial's device.
            state = torch.load(os.path.join(ckpt_dir, CHECKPOINT_FILE), map_location="cpu",
                               weights_only=False)
        for note in algo.load_state_dict(state):
            print(f"restore: {note}", flush=True)
    # lowest_mi: every epoch's (train_acc, mi_eval), and the weights of the epochs the rule
    # could still pick (a small Pareto set), kept in the checkpoint so a restart loses nothing.
    records = [EpochRecord(**r) for r in (state.get("records", []) if resumed else [])]
    kept = dict(state.get("kept", {})) if resumed else {}
    start_epoch = algo.epoch + 1
    node = socket.gethostname()
    # Hostnames repeat across Ray nodes on one machine (and in some clusters); the node id not.
    node_id = ray.get_runtime_context().get_node_id()
    fail_at = config.get("fail_once_at_epoch")

    for epoch in range(start_epoch, epochs + 1):
        if fail_at is not None and epoch == int(fail_at) and not resumed:
            raise InjectedFailure(f"injected failure at epoch {epoch} (fail_once_at_epoch)")
        # Wall seconds of each part of the epoch: time_s (the training steps, measured by the
        # method) + eval_s + mi_eval_s + ckpt_s <= epoch_s; bench/epoch_cost.py prints them.
        epoch_start = time.perf_counter()
        stats = algo.run_epoch()
        part_start = time.perf_counter()
        evaluated = algo.evaluate()
        eval_s = time.perf_counter() - part_start
        metrics: dict[str, float | int | str] = {
            "epoch": epoch, "loss_task": stats.loss_task, "penalty": stats.penalty,
            "mi_batch": stats.mi_batch, "time_s": stats.time_s, **evaluated,
            "start_epoch": start_epoch, "node": node, "node_id": node_id,
            "machine": machine_id(), "mi_eval": math.nan,
            "eval_s": eval_s, "mi_eval_s": 0.0,
        }
        if math.isfinite(stats.guarded_frac):
            metrics["guarded_frac"] = stats.guarded_frac
        diverged = divergence(metrics, watched)
        if diverged:
            # Stop with the reason on record; no checkpoint (a NaN model is not worth resuming)
            # so a restart could not pick it up either. The sweep goes on without it.
            metrics["diverged"] = diverged
            metrics["epoch_s"] = time.perf_counter() - epoch_start
            tune.report(metrics)
            return
        estimate = epoch == epochs or (stopping and epoch % every == 0)
        if estimate:
            part_start = time.perf_counter()
            z, y, c = algo.train_eval_set()
            metrics["mi_eval"] = mi_eval(z, c, seed=seed, steps=mi_steps)
            # Colour beyond the label: c shuffled within each class (0 for a z that encodes
            # y alone; plain mi_eval then still reads about I(y; c)).
            metrics["mi_eval_cond"] = mi_eval(z, c, seed=seed, steps=mi_steps, given=y)
            if stopping:
                # The same estimators on the model's own predictions: floors that an estimate
                # on z reads below only when the estimator fails on z (unbiased/stopping.py).
                pred = algo.predictions(z)
                metrics["mi_floor"] = mi_eval(pred, c, seed=seed, steps=mi_steps)
                metrics["mi_floor_cond"] = mi_eval(pred, c, seed=seed, steps=mi_steps, given=y)
            metrics["mi_eval_s"] = time.perf_counter() - part_start
        part_start = time.perf_counter()
        state = algo.state_dict()
        if stopping and estimate:
            records.append(EpochRecord(
                epoch, float(metrics["train_acc"]), float(metrics["mi_eval"]),
                float(metrics["mi_eval_cond"]), float(metrics["mi_floor"]),
                float(metrics["mi_floor_cond"])))
            kept[epoch] = {"g": state["g"], "f": state["f"]}
            keep = could_be_picked(records, criterion)
            kept = {e: w for e, w in kept.items() if e in keep}
        if stopping:  # in every checkpoint, estimated this epoch or not
            state["records"] = [vars(r) for r in records]
            state["kept"] = kept
        if epoch == epochs:
            chosen = pick_epoch(records, criterion=criterion) if stopping else epoch
            if chosen is None:
                # No epoch with a usable estimate (NaN, or below its floor): report the last.
                chosen = epoch
                metrics["selection_note"] = (f"no epoch with a usable {criterion} (NaN or "
                                             f"below its prediction floor): last epoch")
            metrics["selected_epoch"] = chosen
            if stopping:
                weights = kept.get(chosen) or {"g": state["g"], "f": state["f"]}
                state["selected"] = {"epoch": chosen, **weights}
                # The chosen epoch's estimates again, with another seed (T's init, batches
                # and 80/20 split): the minimum of noisy estimates is biased low, this is not.
                again_start = time.perf_counter()
                with algo.at_weights(weights["g"], weights["f"]):
                    z, y, c = algo.train_eval_set()
                    again = seed + REESTIMATE_SEED_OFFSET
                    metrics["selected_mi_eval"] = mi_eval(z, c, seed=again, steps=mi_steps)
                    metrics["selected_mi_eval_cond"] = mi_eval(z, c, seed=again,
                                                               steps=mi_steps, given=y)
                # mi_eval's seconds, not the checkpoint's: ckpt_s starts after them.
                again_s = time.perf_counter() - again_start
                metrics["mi_eval_s"] = float(metrics["mi_eval_s"]) + again_s
                part_start += again_s
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(state, os.path.join(tmp, CHECKPOINT_FILE))
            now = time.perf_counter()
            metrics["ckpt_s"] = now - part_start
            metrics["epoch_s"] = now - epoch_start
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
