"""A repeat's records: its files (metrics.jsonl, params.jsonl as they are written; the summary
last), its gradient traffic, its FLOP count and MLPerf log, kept apart from the training loop."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from repro500.capture import seeds as seeding
from repro500.ext.specs import PARAMETERS
from repro500.mlperf.logger import BENCHMARK_FOR_TASK, MLPerfLogger
from repro500.rundir import layout
from repro500.rundir.sums import REPEAT_SUMMARY_SCHEMA
from repro500.workloads.parts import dataset_ref
from repro500.workloads.trainer import metrics as measure


def summarise(
    spec: Any, repeat: int, seeds: seeding.Seeds, status: str, error: str | None, epochs_run: int,
    epochs_to_quality: int | None, time_to_quality_s: float | None, train_time_s: float, total_s: float,
    samples_seen: int, flops_per_sample: float | None, eval_metrics: dict[str, Any], epoch_digests: list[str],
    final_digest: str, dist: Any, traffic: Traffic | None = None,
) -> dict[str, Any]:
    metric_name, target_value = spec.target["metric"], float(spec.target["value"])
    direction = spec.target.get("direction", "higher")
    train_flops = flops_per_sample * samples_seen if flops_per_sample is not None else None
    # HPC AI500: FLOPS = counted training FLOPs / time-to-quality (the whole run when not reached)
    quality_time_s = time_to_quality_s if time_to_quality_s is not None else total_s
    flops_per_s = train_flops / quality_time_s if train_flops is not None and quality_time_s > 0 else None
    achieved = eval_metrics.get(metric_name)
    vflops = None
    if flops_per_s is not None and achieved is not None:
        vflops = measure.valid_flops(flops_per_s, achieved, target_value, direction, spec.valid_flops_exponent)
    metrics: dict[str, Any] = dict(eval_metrics)
    metrics.update({
        "throughput_samples_per_s": samples_seen / train_time_s if train_time_s > 0 else None,
        "train_flops": train_flops,
        "flops_per_s": flops_per_s,
        "valid_flops": vflops,
        "time_to_quality_s": time_to_quality_s,
        "epochs_to_quality": epochs_to_quality,
        "train_time_s": train_time_s,
        "total_time_s": total_s,
        **(traffic or Traffic()).per_step(),
    })
    return {
        "schema": REPEAT_SUMMARY_SCHEMA,
        "repeat": repeat,
        "status": status,
        "seeds": seeds.as_dict(),
        "engine": dist.engine,
        "world_size": dist.world_size,
        "epochs_run": epochs_run,
        "epochs_budget": spec.epochs,
        "target": {"metric": metric_name, "value": target_value, "direction": direction},
        "reached_target": epochs_to_quality is not None,
        "epochs_to_quality": epochs_to_quality,
        "time_to_quality_s": time_to_quality_s,
        "train_time_s": train_time_s,
        "samples_seen": samples_seen,
        "metrics": {k: measure.finite_or_none(v) for k, v in metrics.items()},
        "valid_flops": {
            "valid_flops": vflops, "flops_per_s": flops_per_s, "train_flops": train_flops,
            "flops_per_sample": flops_per_sample, "time_s": quality_time_s, "achieved": achieved,
            "target": target_value, "direction": direction, "exponent": spec.valid_flops_exponent,
            "formula": "flops_per_s * (achieved/target) ** exponent, uncapped: above-target quality raises it "
                       "(lower-is-better: (target/achieved) ** exponent)",
        },
        "final_param_digest": final_digest,
        "epoch_param_digests": epoch_digests,
        "wire": (traffic or Traffic()).wire_by_rank(),
        "error": error,
    }


@dataclass
class Traffic:
    """Gradient exchange over a repeat: sums of the step records' costs (rank 0's, as recorded)."""

    steps: int = 0
    bytes_sent: float = 0.0
    bytes_received: float = 0.0
    dense_bytes_sent: float = 0.0
    time_compress_s: float = 0.0
    time_decompress_s: float = 0.0
    time_comm_s: float = 0.0
    # measured on the kernel's TCP counters, per rank (engines.wire); None once a reading failed
    wire_sent: list[float] | None = None
    wire_received: list[float] | None = None
    wire_steps: int = 0
    wire_missing: bool = False

    def add_wire(self, epoch_wire: dict[str, Any] | None) -> None:
        """Add one epoch's measured per-rank bytes (None: one process, or no measurement)."""
        if epoch_wire is None:
            self.wire_missing = self.wire_missing or self.wire_sent is not None
            return
        if self.wire_sent is None:
            self.wire_sent = [0.0] * len(epoch_wire["bytes_sent"])
            self.wire_received = [0.0] * len(epoch_wire["bytes_sent"])
        self.wire_sent = [a + b for a, b in zip(self.wire_sent, epoch_wire["bytes_sent"], strict=True)]
        self.wire_received = [a + b for a, b in zip(self.wire_received, epoch_wire["bytes_received"], strict=True)]
        self.wire_steps += int(epoch_wire["steps"])

    def wire_by_rank(self) -> dict[str, Any] | None:
        """Measured bytes per step of every rank, for the repeat summary (None when not measured)."""
        if self.wire_sent is None or self.wire_missing or not self.wire_steps:
            return None
        n = self.wire_steps
        return {"source": "kernel tcp_info of each rank's TCP sockets (ss)", "steps": n,
                "bytes_sent_per_step": [v / n for v in self.wire_sent],
                "bytes_received_per_step": [v / n for v in (self.wire_received or [])]}

    def add(self, record: dict[str, Any]) -> None:
        if record.get("bytes_sent") is None:
            return  # one process: nothing exchanged
        self.steps += 1
        for key in ("bytes_sent", "bytes_received", "dense_bytes_sent", "time_compress_s",
                    "time_decompress_s", "time_comm_s"):
            setattr(self, key, getattr(self, key) + float(record.get(key) or 0.0))

    def per_step(self) -> dict[str, float | None]:
        """Means per step for the repeat summary (None without a gradient exchange)."""
        n = self.steps

        def mean(total: float) -> float | None:
            return total / n if n else None

        return {
            "bytes_sent_per_step": mean(self.bytes_sent),
            "bytes_received_per_step": mean(self.bytes_received),
            "dense_bytes_per_step": mean(self.dense_bytes_sent),
            "compression_ratio": self.dense_bytes_sent / self.bytes_sent if n and self.bytes_sent else None,
            "time_compress_per_step_s": mean(self.time_compress_s),
            "time_decompress_per_step_s": mean(self.time_decompress_s),
            "time_comm_per_step_s": mean(self.time_comm_s),
            **self._wire_means(),
        }

    def _wire_means(self) -> dict[str, float | None]:
        by_rank = self.wire_by_rank()
        if by_rank is None:
            return {"wire_bytes_sent_per_step": None, "wire_bytes_received_per_step": None}
        sent, received = by_rank["bytes_sent_per_step"], by_rank["bytes_received_per_step"]
        return {"wire_bytes_sent_per_step": sum(sent) / len(sent),
                "wire_bytes_received_per_step": sum(received) / len(received)}


def compressor_spec(spec: Any, seeds: seeding.Seeds) -> dict[str, Any]:
    """The recipe's compressor as a dict, seeded from the repeat unless the recipe gives a seed.

    Rank 0's seed is used on every rank: random-k needs the same positions everywhere; the
    stochastic quantizers add the rank themselves.  A seed of None is unset too: that is how the
    run's resolved spec records a per-repeat seed (repro500.ext.specs.resolve), so that spec
    can be given back as a recipe's compressor.
    """
    out = {"name": spec} if isinstance(spec, str) else dict(spec)
    if "seed" in PARAMETERS.get(str(out.get("name", "")).lower(), {}) and out.get("seed") is None:
        out["seed"] = seeds.compressor  # rank 0's torch seed as this repeat (or its cell) uses it
    return out


def mlperf_logger(spec: Any, out_dir: Path, seeds: seeding.Seeds, dist: Any) -> Any:
    gpus = torch.cuda.device_count() if spec.device in ("cuda", "auto") and torch.cuda.is_available() else 0
    return MLPerfLogger(
        out_dir / layout.MLLOG,
        benchmark=spec.mlperf_benchmark or BENCHMARK_FOR_TASK[spec.workload],
        division=spec.mlperf_division,
        seed=seeds.torch,
        global_batch_size=spec.batch_size * dist.world_size,
        gradient_accumulation_steps=spec.batch_size // (spec.micro_batch_size or spec.batch_size),
        optimizer=spec.optimizer,
        lr_schedule=spec.lr_schedule,
        epochs=spec.epochs,
        target=spec.target,
        world_size=dist.world_size,
        accelerators_per_node=gpus,
        hyperparameters=workload_records(spec),
    )


def workload_records(spec: Any) -> dict[str, Any]:
    """What the log says of the model and data beyond MLPerf's keys: repro500's workloads are
    not MLPerf's reference (open division), so the log names what was trained, and how."""
    records: dict[str, Any] = {
        "repro500_model": {"name": spec.model, "options": dict(spec.model_options)},
        "repro500_dataset": {"name": dataset_ref(spec.dataset)[1], "params": dict(spec.dataset.get("params") or {})},
    }
    dropout = spec.model_options.get("dropout")
    if dropout is not None:  # a key MLPerf's CosmoFlow rules know
        records["dropout"] = float(dropout)
    return records


def log_data(mllog: Any, train_set: Any, eval_set: Any) -> None:
    """``repro500_data``: each split's own account of its samples (a data set's ``description``:
    e.g. the cosmo universes' size, generator and parameters, and the reference they stand for)."""
    described = {split: getattr(ds, "description", None) for split, ds in (("train", train_set), ("eval", eval_set))}
    if any(v is not None for v in described.values()):
        mllog.event("repro500_data", described)


class RepeatFiles:
    """``metrics.jsonl`` and ``params.jsonl`` of a repeat, line-buffered so a crash keeps every
    finished line."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(out_dir / layout.METRICS, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
        self._params = open(out_dir / layout.PARAMS, "w", encoding="utf-8", buffering=1)  # noqa: SIM115

    def metric(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(record, allow_nan=False) + "\n")

    def params(self, record: dict[str, Any]) -> None:
        self._params.write(json.dumps(record, allow_nan=False) + "\n")

    def close(self) -> None:
        for fh in (self._metrics, self._params):
            if not fh.closed:
                fh.close()
