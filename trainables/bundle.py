"""A trial bundle's trainable: several grid points trained as one trial (`--bundle N`).

The config holds the settings the points share and, under "members", each point (its lam,
seed, data axes...). Each member is a whole mi_backprop trial (its benchmark built from its
own config, its plan, stopping rule, checkpoint state); `MIBackpropBundle`
(unbiased/methods/bundle.py) trains them together, and everything after the training of an
epoch (evaluation, MI estimates, the stopping rule, the selected epoch) is run_trial's, per
member. One report per epoch carries every member's metrics under "m<i>/" and the trial's
`epoch`; its checkpoint holds a file per member (trainables/session.py). A member that
diverges reports it once, is frozen, and its checkpoint keeps the reason; the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trainables.common import (
    InjectedFailure,
    Plan,
    StoppingRecords,
    close_epoch,
    epoch_columns,
    start_trial,
    train_epoch,
)
from trainables.session import TrialSession, checkpoint_files, read_checkpoint
from unbiased.data import Benchmark
from unbiased.methods import make_method
from unbiased.methods.bundle import MIBackpropBundle

MEMBERS_KEY = "members"  # a bundle trial's config: its grid points under this key
WATCHED = ("loss_task", "penalty", "mi_batch", "mi")


def member_key(index: int) -> str:
    return f"m{index}"


def member_configs(config: dict) -> list[dict]:
    """Each member's whole config: the shared settings and its own point."""
    shared = {k: v for k, v in config.items() if k != MEMBERS_KEY}
    return [{**shared, **point} for point in config[MEMBERS_KEY]]


def run_bundle(config: dict, build: Callable[[dict], Benchmark],
               session: TrialSession | None = None) -> None:
    """Train a bundle trial (module docstring); `session` is Tune's unless given."""
    config, session, device = start_trial(config, session)
    if device is None:
        return
    configs = [{**c, "device": str(device)} for c in member_configs(config)]
    plans = [Plan.of(c) for c in configs]
    algos = [make_method(p.method, build(c).to(device), c, seed=p.seed, device=device)
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
    for key, algo in zip(keys, algos, strict=True):
        if key in diverged:
            algo.epoch = reached  # frozen where it was; it keeps the others' step
    rules = [StoppingRecords(p.criterion, states.get(k)) if p.stopping else None
             for p, k in zip(plans, keys, strict=True)]
    # On a GPU the critic's shuffles of all members come in one draw a step (unbiased/
    # methods/bundle.py, DRAWS); on a CPU each member draws its own, as its run alone.
    bundle = MIBackpropBundle(algos, draws="batched" if device.type == "cuda" else "exact")
    for i, key in enumerate(keys):
        if key in diverged:
            bundle.freeze(i)
    start_epoch = reached + 1
    where = epoch_columns(config, device, session)
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
            if key in diverged:
                kept[key] = {"diverged": diverged[key], "epoch": epoch}
                continue
            metrics = train_epoch(algos[i], epoch, start_epoch, where, stats=stats[i])
            state, started = close_epoch(algos[i], plans[i], rules[i], metrics, WATCHED)
            if state is None:  # this member diverged: frozen from here on
                diverged[key] = str(metrics["diverged"])
                bundle.freeze(i)
                kept[key] = {"diverged": diverged[key], "epoch": epoch}
            else:
                kept[key] = state
                ckpt_start = started if ckpt_start is None else min(ckpt_start, started)
            report.update({f"{key}/{k}": v for k, v in metrics.items()})
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
