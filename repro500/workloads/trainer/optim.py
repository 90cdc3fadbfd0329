"""The optimizers and learning-rate schedules a recipe names (``mutable.optimizer``,
``mutable.lr_schedule``; the recipe schema accepts exactly these)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from repro500.errors import UsageError


def build_optimizer(params: Iterable[torch.nn.Parameter], spec: dict[str, Any]) -> torch.optim.Optimizer:
    name = spec.get("name", "sgd")
    lr = float(spec.get("lr", 0.1))
    wd = float(spec.get("weight_decay", 0.0))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(spec.get("momentum", 0.0)), weight_decay=wd,
                               nesterov=bool(spec.get("nesterov", False)))
    betas = tuple(spec.get("betas", (0.9, 0.999)))
    eps = float(spec.get("eps", 1e-8))
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)

    raise UsageError(f"unknown optimizer {name!r}; choose sgd, adam or adamw")


def lr_factor(spec: dict[str, Any], epoch_float: float, total_epochs: int) -> float:
    """Multiplier of the base learning rate at a (fractional) epoch."""
    warmup = float(spec.get("warmup_epochs", 0) or 0)
    if warmup > 0 and epoch_float < warmup:
        return (epoch_float + 1e-12) / warmup
    name = spec.get("name", "constant")
    gamma = float(spec.get("gamma", 0.1))
    if name == "step":
        return gamma ** int(epoch_float // max(1, int(spec.get("step_epochs", 30))))
    if name == "multistep":
        return gamma ** sum(1 for m in spec.get("milestones", []) if epoch_float >= m)
    if name == "cosine":
        span = max(total_epochs - warmup, 1e-12)
        progress = min(max((epoch_float - warmup) / span, 0.0), 1.0)
        floor = float(spec.get("min_lr", 0.0))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


__all__ = ["build_optimizer", "lr_factor"]
