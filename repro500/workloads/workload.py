"""What the runner runs: a :class:`Workload`, one interface for every kind of experiment.

- :class:`TrainedWorkload`: the built-in trainer on a model, data set and evaluator found
  through the plug-in door (repro500's own and a user's alike, ``plugins.py``), on the
  local, DDP or Horovod engine.
- :class:`CommandWorkload`: any program, once per repeat, its metrics read from what it
  already produces (``command.py``).
- :class:`~repro500.system.workload.SystemWorkload`: a measurement of the machine itself
  (operators, roofline, inference latency, I/O; docs/system.md).

The runner asks a workload four things: which files are its data (captured and digested),
which metrics a repeat reports (acceptance names are checked against them before anything is
written), to check itself before the run starts, to run one repeat, and for the manifest: what
it is and which of the experiment's files to keep with the run.
"""

from __future__ import annotations

import difflib
import glob
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from repro500.capture import seeds as seeding
from repro500.errors import InvalidInput
from repro500.recipe import load as recipes

# The run-level metrics every trained repeat's summary reports next to its evaluator's
# (train._summarise writes them; docs/run.md lists them).
SUMMARY_METRICS = ("throughput_samples_per_s", "train_flops", "flops_per_s", "valid_flops",
                   "time_to_quality_s", "epochs_to_quality", "train_time_s", "total_time_s",
                   # gradient traffic per step (None on one process): train.Traffic.per_step
                   "bytes_sent_per_step", "bytes_received_per_step", "dense_bytes_per_step",
                   "compression_ratio", "time_compress_per_step_s", "time_decompress_per_step_s",
                   "time_comm_per_step_s",
                   # measured on each rank's TCP sockets (engines.wire), mean over ranks
                   "wire_bytes_sent_per_step", "wire_bytes_received_per_step",
                   # added beside the trainer by repro500.workloads.trainer.epochs (docs/system.md)
                   "energy_j", "energy_j_per_sample", "flops_per_j", "cpu_utilization_pct", "gpu_utilization_pct",
                   "data_wait_fraction", "arithmetic_intensity_flop_per_byte", "achieved_flops_per_s")
COMMAND_METRICS = ("total_time_s",)


@dataclass
class Progress:
    """Hooks a repeat reports progress through (the runner's display and MLflow); all optional."""

    on_epoch_start: Callable[[int, int], None] | None = None  # (epoch, steps in epoch)
    on_step: Callable[[dict[str, Any]], None] | None = None
    on_epoch_end: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None
    on_line: Callable[[str, str], None] | None = None  # a command's (stream, line)
    on_started: Callable[[], None] | None = None  # the repeat's own process is running (a command's)


@dataclass
class Repeat:
    """One repeat to run: its index, seeds and directory, and what it needs of the run around it."""

    k: int
    seeds: seeding.Seeds
    out_dir: Path
    progress: Progress = field(default_factory=Progress)
    run_id: str = ""  # the repro500 run's id
    mlflow: Any = None  # command_repeat.MlflowTarget: where a wrapped script's own MLflow runs go
    own_outputs: list[Path] = field(default_factory=list)  # repro500's files: never a command's inputs
    source_files: frozenset[str] = frozenset()  # the experiment's files the run copied into source/
    deterministic: bool | None = None  # this repeat's torch determinism (a factorial run's kernels cell)
    varied: tuple[str, ...] | None = None  # the seeds this repeat draws itself (capture.seeds.derive_varied)


class Workload(Protocol):
    kind: str  # "trained" | "command" | "system"
    imported: list[tuple[str, str]]  # (import root, file) of experiment modules loaded in this process

    def data_paths(self) -> list[str]: ...
    def input_paths(self) -> list[str]: ...  # a wrapped command's declared inputs (data read in place)
    def metric_names(self) -> list[str]: ...
    def check(self) -> None: ...
    def run_repeat(self, repeat: Repeat) -> dict[str, Any]: ...
    def describe(self) -> dict[str, Any]: ...  # the manifest's experiment.workload
    def source(self, exclude: list[Path]) -> tuple[Path, list[str]] | None: ...  # files kept in source/


def unknown_metric(where: str, name: str, allowed: list[str], kind: str) -> InvalidInput:
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return InvalidInput(f"{where} {name!r} is not {kind}; {hint}allowed: {', '.join(allowed)}")


def check_acceptance(recipe: recipes.Recipe, reported: list[str]) -> None:
    """Every acceptance metric must be one a repeat's summary reports."""
    for name in recipe.acceptance:
        if name not in reported:
            raise unknown_metric(f"{recipe.source}: acceptance", name, reported, "a metric this workload reports")


def expand_paths(values: list[str], key: str) -> list[str]:
    """Data paths with their globs expanded; a path or glob that names nothing is one sentence."""
    out = []
    for p in dict.fromkeys(values):
        if any(ch in p for ch in "*?["):
            matches = sorted(glob.glob(p))
            if not matches:
                raise InvalidInput(f"{key} {p!r} matches no file; generate the data first (repro500 data generate)")
            out.extend(matches)
        else:
            if not Path(p).exists():
                raise InvalidInput(f"dataset {p} does not exist; generate it first (repro500 data generate ...) or fix {key}")
            out.append(p)
    return out


__all__ = ["COMMAND_METRICS", "SUMMARY_METRICS", "Progress", "Repeat", "Workload"]
