"""Debiasing methods behind one interface (DomainBed's `algorithms.py` style): `METHODS`
maps a `--method` name to its class; `make_method` builds one from a trial's flat config.
"""

from __future__ import annotations

import importlib
from dataclasses import fields

import torch

from unbiased.data import Benchmark
from unbiased.method_catalogue import DEFAULT_METHOD, catalogue
from unbiased.methods.base import ERM, EpochStats, TrainConfig

METHODS: dict[str, type[ERM]] = {
    name: getattr(importlib.import_module(entry.module_path()), entry.cls)
    for name, entry in catalogue().items()}

__all__ = ["METHODS", "DEFAULT_METHOD", "ERM", "EpochStats", "TrainConfig", "method_class",
           "method_config", "make_method", "config_keys"]


def method_class(name: str) -> type[ERM]:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name]


def config_keys(name: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(method_class(name).Config))


def method_config(name: str, values: dict) -> TrainConfig:
    """The method's Config from the keys of `values` it has, validated."""
    cls = method_class(name)
    keys = set(config_keys(name))
    return cls.Config(**{k: v for k, v in values.items() if k in keys}).validate()


def make_method(name: str, bench: Benchmark, values: dict, seed: int,
                device: torch.device | str = "cpu") -> ERM:
    return method_class(name)(bench, method_config(name, values), seed, device)
