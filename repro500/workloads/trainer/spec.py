"""What a repeat of a trained workload is given: the resolved recipe's training keys, where the
process sits in a distributed job, and the runner's hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Dist:
    """Where this process sits in a distributed job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    engine: str = "local"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class TrainSpec:
    """Everything a repeat needs, taken from the resolved recipe."""

    workload: str
    model: str
    dataset: dict[str, Any]
    target: dict[str, Any]
    epochs: int
    model_options: dict[str, Any] = field(default_factory=dict)
    valid_flops_exponent: int = 5
    mlperf_benchmark: str | None = None
    mlperf_division: str = "open"
    batch_size: int = 64
    eval_batch_size: int = 256
    optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.1})
    lr_schedule: dict[str, Any] = field(default_factory=lambda: {"name": "constant"})
    device: str = "cpu"
    compressor: Any = "none"
    workers: int = 0
    threads: int | None = None
    deterministic: bool = False
    precision: str = "fp32"  # fp32 | amp-bf16 | amp-fp16 (workloads/step.py)
    micro_batch_size: int | None = None  # gradient accumulation over batch_size / micro_batch_size parts
    sync: dict[str, Any] = field(default_factory=lambda: {"mode": "allreduce", "every": 1})  # engines/averaging.py
    evaluate: str | None = None  # fixed.evaluate: a plug-in evaluator (default: the task's own)
    search_paths: list[str] = field(default_factory=list)  # where plug-ins' import paths are found

    @classmethod
    def from_recipe(cls, fixed: dict[str, Any], mutable: dict[str, Any]) -> TrainSpec:
        keys = {f for f in cls.__dataclass_fields__}
        merged = {k: v for k, v in {**fixed, **mutable}.items() if k in keys}
        return cls(**merged)

