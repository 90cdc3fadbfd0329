"""The optimizer and learning-rate schedule as MLPerf's log keys (``opt_*``): what the trainer ran,
named the way MLPerf's rules name it (:mod:`repro500.mlperf.logger` writes them into each
repeat's log)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# repro500 optimizer names -> MLPerf's ``opt_name`` values (mllog.constants). MLPerf's
# "sgd" is SGD with (optional) momentum, which is what torch.optim.SGD is.
OPTIMIZER_NAMES = {
    "sgd": "sgd",
    "momentum": "sgd",
    "nesterov": "sgd",
    "lars": "lars",
    "adam": "adam",
    "adamw": "adamw",
    "lamb": "lamb",
    "adagrad": "adagrad",
}


@dataclass(frozen=True)
class OptimizerInfo:
    """The optimizer and learning-rate schedule, as MLPerf's hyperparameter keys need them.

    ``None`` fields are not logged.  Epoch counts are in epochs, rates are plain numbers.
    """

    name: str  # repro500's name (sgd, lars, adam, adamw, ...); see OPTIMIZER_NAMES
    base_lr: float
    momentum: float | None = None
    weight_decay: float = 0.0
    warmup_epochs: float = 0.0
    warmup_factor: float | None = None
    end_lr: float | None = None
    decay_boundary_epochs: Sequence[int] | None = None
    decay_factor: float | None = None
    decay_poly_power: float | None = None
    decay_steps: int | None = None

    @property
    def mlperf_name(self) -> str:
        return OPTIMIZER_NAMES.get(self.name.lower(), self.name.lower())

    @classmethod
    def from_recipe(
        cls,
        optimizer: Mapping[str, Any],
        lr_schedule: Mapping[str, Any] | None = None,
        epochs: int | None = None,
    ) -> OptimizerInfo:
        """From a recipe's ``mutable.optimizer`` and ``mutable.lr_schedule`` (docs/recipes.md).

        ``epochs`` (the budget) turns a ``step`` schedule into its decay boundaries.
        """
        schedule = dict(lr_schedule or {})
        base_lr = float(optimizer.get("lr", 0.1))
        kind = schedule.get("name", "constant")
        gamma = float(schedule.get("gamma", 0.1))
        boundaries: list[int] | None = None
        end_lr = None
        if kind == "multistep":
            boundaries = [int(m) for m in schedule.get("milestones", [])]
        elif kind == "step" and epochs:
            every = max(1, int(schedule.get("step_epochs", 30)))
            boundaries = list(range(every, int(epochs), every))
        elif kind == "cosine":
            end_lr = base_lr * float(schedule.get("min_lr", 0.0))  # min_lr is a fraction of lr
        # momentum is SGD's: Adam's betas are not a momentum MLPerf's opt_momentum would describe
        momentum = optimizer.get("momentum") if optimizer.get("name", "sgd") == "sgd" else None
        return cls(
            name=str(optimizer.get("name", "sgd")),
            base_lr=base_lr,
            momentum=None if momentum is None else float(momentum),
            weight_decay=float(optimizer.get("weight_decay", 0.0)),
            warmup_epochs=float(schedule.get("warmup_epochs", 0) or 0),
            end_lr=end_lr,
            decay_boundary_epochs=boundaries,
            decay_factor=gamma if boundaries is not None else None,
        )


def optimizer_records(benchmark: str, optimizer: OptimizerInfo) -> dict[str, Any]:
    """The MLLOG hyperparameter keys for ``optimizer``, named as ``benchmark``'s rules name them."""
    name = optimizer.mlperf_name
    records: dict[str, Any] = {
        "opt_name": name,
        "opt_base_learning_rate": optimizer.base_lr,
        "opt_weight_decay": optimizer.weight_decay,
        "opt_learning_rate_warmup_epochs": optimizer.warmup_epochs,
        "opt_learning_rate_warmup_factor": optimizer.warmup_factor,
        "opt_end_learning_rate": optimizer.end_lr,
        "opt_learning_rate_decay_boundary_epochs": optimizer.decay_boundary_epochs,
        "opt_learning_rate_decay_factor": optimizer.decay_factor,
        "opt_learning_rate_decay_steps": optimizer.decay_steps,
        "opt_momentum": optimizer.momentum,
    }
    if benchmark == "resnet" and name in ("sgd", "lars"):
        # The ResNet rules name these per optimizer (training_*/closed_resnet_{sgd,lars}.yaml).
        prefixed = {
            "opt_base_learning_rate": optimizer.base_lr,
            "opt_end_learning_rate": optimizer.end_lr,
            "opt_learning_rate_decay_poly_power": optimizer.decay_poly_power,
            "opt_learning_rate_decay_steps": optimizer.decay_steps,
            "opt_weight_decay": optimizer.weight_decay,
            "opt_momentum": optimizer.momentum,
        }
        if name == "lars":
            prefixed["opt_learning_rate_warmup_epochs"] = optimizer.warmup_epochs
        records.update({f"{name}_{key}": value for key, value in prefixed.items()})
        for key in prefixed:
            records.pop(key, None)
    return {key: value for key, value in records.items() if value is not None}
