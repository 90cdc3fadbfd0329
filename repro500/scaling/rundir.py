"""What a run directory measured, as the scaling model needs it.

Reads ``run.json`` (world size), ``recipe.yaml`` (model name, compressor) and the ``step``
records of every ``repeats/<k>/metrics.jsonl`` (docs/contracts.md).  The first step of each
repeat is left out: it pays for warm-up (allocations, and DDP rebuilding its buckets).

Compute time per step is forward + backward + optimizer.  On several ranks DDP runs the
communication hooks inside the backward pass, so the communication the backward pass waited
for (``time_comm_wait_s``: from the last bucket's launch to the end of the backward pass) and
the compression (``time_compress_s``, on the training thread) are taken out of it: what
remains is the rank's own computation, which data-parallel weak scaling keeps constant.
Collectives that ran while the backward pass still computed are not taken out: that time was
spent computing.  Runs recorded before ``time_comm_wait_s`` existed fall back to taking out
``time_comm_s`` + ``time_compress_s`` + ``time_decompress_s``, which removes computation too
(biased low).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput
from repro500.rundir import layout

TIMING_KEYS = ("time_forward_s", "time_backward_s", "time_optimizer_s", "step_time_s")


@dataclass(frozen=True)
class RunTimings:
    """Per-step means over a run's usable step records (rank 0's, seconds and bytes)."""

    path: Path
    world_size: int
    model_name: str | None
    compressor: Any  # the recipe's mutable.compressor (name or mapping)
    sync: dict[str, Any]  # the recipe's mutable.sync: gradients all-reduced, or parameters averaged every H steps
    steps: int  # step records averaged
    step_time_s: float
    data_time_s: float
    compute_time_s: float  # forward + backward + optimizer, communication taken out
    comm_time_s: float | None  # recorded collective time, launch to completion (None on one rank)
    comm_wait_s: float | None  # what the backward pass waited for after its last launch (DDP)
    compress_time_s: float | None
    decompress_time_s: float | None
    bytes_sent: float | None  # per step and rank
    last_bytes_sent: float | None  # the last step's (PowerSGD compresses only after start_iter)
    dense_bytes_sent: float | None  # a plain allreduce of the same gradients
    # the last step's "compressed" (False: PowerSGD had not started; None: not recorded, older runs)
    last_compressed: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "world_size": self.world_size, "steps": self.steps,
                "step_time_s": self.step_time_s, "data_time_s": self.data_time_s,
                "compute_time_s": self.compute_time_s, "comm_time_s": self.comm_time_s,
                "comm_wait_s": self.comm_wait_s,
                "compress_time_s": self.compress_time_s, "decompress_time_s": self.decompress_time_s,
                "bytes_sent": self.bytes_sent, "dense_bytes_sent": self.dense_bytes_sent}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


_read_json = layout.read_optional_json  # the run directory's reading rules are rundir's
_read_recipe = layout.read_optional_yaml


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """Usable step records of every repeat, the first step of each left out (warm-up)."""
    out: list[dict[str, Any]] = []
    run = layout.RunDir(run_dir)
    for k in layout.repeat_indices(run_dir):
        records, _ = layout.metric_records(run.repeat(k) / layout.METRICS)
        steps = [r for r in records if r.get("kind") == "step"
                 and all(_number(r.get(key)) is not None for key in TIMING_KEYS)]
        out.extend(steps[1:] if len(steps) > 1 else steps)
    return out


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (_number(r.get(key)) for r in records) if v is not None]
    return statistics.fmean(values) if values else None


def _compute_s(record: dict[str, Any], world_size: int, has_wait: bool) -> float:
    """One step's own computation: forward + backward + optimizer less what was communication."""
    busy = sum(float(record[k]) for k in ("time_forward_s", "time_backward_s", "time_optimizer_s"))
    if world_size < 2:
        return busy
    exchanged = ("time_comm_wait_s", "time_compress_s") if has_wait else (
        "time_comm_s", "time_compress_s", "time_decompress_s")
    return busy - sum(_number(record.get(k)) or 0.0 for k in exchanged)


def read_run(path: str | Path) -> RunTimings:
    """The run's per-step timings and bytes (InvalidInput, exit 4, when there are none)."""
    root = Path(path)
    if not root.exists():
        raise InvalidInput(f"{root} does not exist: give a run directory such as runs/<run-id>")
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a directory: give a run directory (unpack an archive first)")
    run = _read_json(root / layout.RUN_JSON)
    recipe = _read_recipe(root / layout.RECIPE)
    fixed = recipe.get("fixed") if isinstance(recipe.get("fixed"), dict) else {}
    mutable = recipe.get("mutable") if isinstance(recipe.get("mutable"), dict) else {}
    world = _number(run.get("world_size")) or _number(mutable.get("nproc")) or 1
    records = step_records(root)
    if not records:
        raise InvalidInput(f"{root} has no step records with timings in repeats/<k>/metrics.jsonl: "
                           "give a run directory written by `repro500 run`")
    world_size = int(world)
    comm = _mean(records, "time_comm_s") if world_size > 1 else None
    compress = _mean(records, "time_compress_s") if world_size > 1 else None
    decompress = _mean(records, "time_decompress_s") if world_size > 1 else None
    wait = _mean(records, "time_comm_wait_s") if world_size > 1 else None
    compute_values = [max(0.0, _compute_s(r, world_size, wait is not None)) for r in records]
    last_sent = _number(records[-1].get("bytes_sent"))
    return RunTimings(
        path=root, world_size=world_size,
        model_name=str(fixed["model"]) if isinstance(fixed.get("model"), str) else None,
        compressor=mutable.get("compressor", run.get("compressor", "none")) or "none",
        sync=mutable.get("sync") if isinstance(mutable.get("sync"), dict) else {"mode": "allreduce", "every": 1},
        steps=len(records),
        step_time_s=_mean(records, "step_time_s") or 0.0,
        data_time_s=_mean(records, "time_data_s") or 0.0,
        compute_time_s=statistics.fmean(compute_values),
        comm_time_s=comm, comm_wait_s=wait, compress_time_s=compress, decompress_time_s=decompress,
        bytes_sent=_mean(records, "bytes_sent") if world_size > 1 else None,
        last_bytes_sent=last_sent if world_size > 1 else None,
        dense_bytes_sent=_mean(records, "dense_bytes_sent") if world_size > 1 else None,
        last_compressed=records[-1].get("compressed") if isinstance(records[-1].get("compressed"), bool) else None,
    )
