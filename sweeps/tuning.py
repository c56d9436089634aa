"""An equal tuning budget: the same number of points for every arm (unbiased/search.py), each
drawn from its method's distributions through Ray Tune's search spaces.

A draw is fixed by the search seed, the arm and its index, the same in every launch and under
every filter, so a screen on one seed and rows on others (`--draw-of ARM=3`) read the same
settings. The drawn and held settings go under SETTINGS_KEY, reaching the trial as flags do.
"""

from __future__ import annotations

import zlib

import numpy as np

from unbiased.search import ARMS, DIGITS, Choice, LogUniform, Space, arm_space
from unbiased.settings import SETTINGS_KEY


def tune_domain(space: Space):
    from ray import tune

    if isinstance(space, LogUniform):
        return tune.loguniform(space.low, space.high)
    if isinstance(space, Choice):
        return tune.choice(list(space.values))
    raise TypeError(f"no Tune search space for {space!r}")


def _rounded(value: object) -> object:
    if isinstance(value, float | np.floating) and value != 0:
        return float(f"{float(value):.{DIGITS}g}")
    return value.item() if isinstance(value, np.generic) else value


def draw(arm_name: str, count: int, search_seed: int) -> list[dict[str, object]]:
    """The arm's first `count` draws (drawn settings, then held ones); draw i does not
    depend on `count`."""
    from unbiased.methods import ERM, method_class

    arm = ARMS[arm_name]
    space = arm_space(arm, method_class(arm.method), ERM)
    rng = np.random.default_rng([search_seed, zlib.crc32(arm_name.encode())])
    domains = {key: tune_domain(space[key]) for key in sorted(space)}
    return [{**{key: _rounded(domain.sample(random_state=rng))
                for key, domain in domains.items()}, **arm.held} for _ in range(count)]


def search_points(values: dict, data_axes: tuple[str, ...]) -> list[dict]:
    """Every trial of a tuning preset, seed first (a grid cut off holds whole seeds);
    `draw_of` keeps only those draws of the arms it names."""
    import itertools

    from unbiased.methods import config_keys

    axes = [[(key, v) for v in (values[key] if isinstance(values[key], list)
                                else [values[key]])] for key in data_axes]
    count = int(values["draws"])
    chosen = values.get("draw_of") or {}
    K = values.get("K")
    K = K[0] if isinstance(K, list) else K
    out = []
    for seed in values["seeds"]:
        for arm_name in values["arms"]:
            arm = ARMS[arm_name]
            settings = draw(arm_name, count, int(values.get("search_seed", 0)))
            keep = chosen.get(arm_name, range(count))
            for data in itertools.product(*axes):
                for index in keep:
                    drawn = dict(settings[index])
                    lam = float(drawn.pop("lam", 1.0))
                    point = {**dict(data), "arm": arm_name, "draw": int(index),
                             "method": arm.method, "lam": lam, "seed": int(seed)}
                    if K is not None and "K" in config_keys(arm.method):
                        point["K"] = int(K)
                    point[SETTINGS_KEY] = drawn
                    out.append(point)
    return out
