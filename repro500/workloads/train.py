"""The trainer: one readable PyTorch loop for every workload.

One call of :func:`train_repeat` is one repeat.  It seeds everything, builds data, model and
optimizer from the resolved recipe, and trains epoch by epoch until the target quality is
reached (time-to-quality) or the epoch budget is spent.  Each step appends a record to
``metrics.jsonl`` with its time split into data / forward / backward / communication /
optimizer; each epoch evaluates, digests the parameters and appends to ``params.jsonl``.
The repeat's ``summary.json`` is written last, atomically: a repeat without one did not finish.

Distributed engines call the same function with a :class:`Dist`; only rank 0 writes files.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from repro500 import atomic
from repro500.bundle import REPEAT_SUMMARY_SCHEMA
from repro500.capture import seeds as seeding
from repro500.workloads import metrics as measure
from repro500.workloads import parts, plugins
from repro500.workloads.engines import wire

STATUS_COMPLETED = "completed"
STATUS_DIVERGED = "diverged"
STATUS_FAILED = "failed"
STATUS_KILLED = "killed"


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
class Callbacks:
    """Hooks the runner uses for progress bars and MLflow; all optional."""

    on_epoch_start: Callable[[int, int], None] | None = None  # (epoch, steps in epoch)
    on_step: Callable[[dict[str, Any]], None] | None = None
    on_epoch_end: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None


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
    batch_size: int = 64
    eval_batch_size: int = 256
    optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.1})
    lr_schedule: dict[str, Any] = field(default_factory=lambda: {"name": "constant"})
    device: str = "cpu"
    compressor: Any = "none"
    workers: int = 0
    threads: int | None = None
    deterministic: bool = False
    evaluate: str | None = None  # fixed.evaluate: a plug-in evaluator (default: the task's own)
    search_paths: list[str] = field(default_factory=list)  # where plug-ins' import paths are found

    @classmethod
    def from_recipe(cls, fixed: dict[str, Any], mutable: dict[str, Any]) -> TrainSpec:
        keys = {f for f in cls.__dataclass_fields__}
        merged = {k: v for k, v in {**fixed, **mutable}.items() if k in keys}
        return cls(**merged)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------
def torch_device(device: str, dist: Dist) -> torch.device:
    """This rank's torch device for the plan's resolved ``device`` (``cpu`` or ``cuda``; the run's
    plan decided, once, what ``mutable.device: auto`` means): GPU ``local_rank % count``."""
    if device == "cuda":
        return torch.device("cuda", dist.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def set_determinism(enabled: bool) -> None:
    """torch's deterministic mode (``--deterministic``); CUBLAS_WORKSPACE_CONFIG is set by the runner
    before CUDA starts."""
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = not enabled and torch.backends.cudnn.benchmark


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
    from repro500.errors import UsageError

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


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _batch_size(inputs: Any) -> int:
    return len(inputs) if isinstance(inputs, (list, tuple)) else int(inputs.shape[0])


class Task:
    """How a workload computes its loss and feeds its evaluator."""

    def __init__(self, workload: str) -> None:
        self.workload = workload
        if workload == "classification":
            self.criterion: Callable[..., torch.Tensor] | None = torch.nn.CrossEntropyLoss()
        elif workload == "regression":
            self.criterion = torch.nn.MSELoss()
        else:
            self.criterion = None

    def loss(self, model: torch.nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
        if self.workload == "detection":
            losses = model(list(inputs), list(targets))
            return sum(losses.values())
        return self.criterion(model(inputs), targets)

    def predict(self, model: torch.nn.Module, inputs: Any) -> Any:
        if self.workload == "detection":
            return model(list(inputs))
        return model(inputs)


def build_data(spec: TrainSpec, dist: Dist, seeds: seeding.Seeds) -> tuple[Any, Any, dict[str, Any]]:
    """Train and eval DataLoaders plus the dataset's info."""
    from torch.utils.data import DataLoader, DistributedSampler

    train_set = parts.open_data(spec.dataset, "train", paths=spec.search_paths)
    eval_set = parts.open_data(spec.dataset, "eval", paths=spec.search_paths)
    info = dict(getattr(train_set, "info", {}))
    collate = None
    if spec.workload == "detection":
        from repro500.workloads.data import collate_detection

        collate = collate_detection
    generator = seeding.loader_generator(seeds)
    # One shuffling rule for every world size: DistributedSampler's permutation seeded with rank 0's
    # loader seed. Rank r takes every world_size-th index, so the union of the ranks' batches at step
    # i is exactly the single-process batch i of world_size times the size.
    shuffle_seed = seeding.derive(seeds.master, seeds.repeat, 0).loader % 2**62
    sampler = DistributedSampler(train_set, num_replicas=dist.world_size, rank=dist.rank, shuffle=True,
                                 seed=shuffle_seed, drop_last=True)
    common = {"num_workers": spec.workers, "worker_init_fn": seeding.seed_worker, "collate_fn": collate,
              "persistent_workers": spec.workers > 0}
    train_loader = DataLoader(train_set, batch_size=spec.batch_size, sampler=sampler, drop_last=True,
                              generator=generator, **common)
    eval_loader = DataLoader(eval_set, batch_size=spec.eval_batch_size, shuffle=False, **common)
    if len(train_loader) == 0:
        from repro500.errors import InvalidInput

        raise InvalidInput(
            f"the training set has {len(train_set)} samples, fewer than one batch of "
            f"{spec.batch_size * dist.world_size}; lower mutable.batch_size or use more data"
        )
    return train_loader, eval_loader, info


def build_model(spec: TrainSpec, info: dict[str, Any]) -> torch.nn.Module:
    """The recipe's model (a built-in or a plug-in: the same factory), shaped by the data's info;
    what the info does not say, the builder's own default decides."""
    from repro500.workloads.models import build_model as factory
    from repro500.workloads.models import model_options

    plugins.add_search_paths(spec.search_paths)
    kwargs: dict[str, Any] = {"in_channels": int(info.get("in_channels", 3))}
    if spec.workload == "classification" and info.get("num_classes") is not None:
        kwargs["num_classes"] = int(info["num_classes"])
    elif spec.workload == "detection" and info.get("num_classes") is not None:
        kwargs["num_classes"] = int(info["num_classes"]) + 1  # + background
    elif spec.workload == "regression":
        kwargs["num_classes"] = int(info.get("num_targets", 4))
    if spec.workload == "detection" and info.get("channel_mean") is not None and "image_mean" in model_options(spec.model):
        # EWA images arrive as stored: the model normalises
        kwargs["image_mean"], kwargs["image_std"] = info["channel_mean"], info["channel_std"]
    kwargs.update(spec.model_options)
    return factory(spec.model, **kwargs)


def evaluate(task: Task, model: torch.nn.Module, loader: Any, device: torch.device,
             info: dict[str, Any], evaluate: str | None = None, paths: list[str] | None = None) -> dict[str, float | None]:
    evaluator = parts.make_evaluator(task.workload, evaluate, info, paths=paths)
    model.eval()
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = _to_device(inputs, device), _to_device(targets, device)
            outputs = task.predict(model, inputs)
            evaluator.update(outputs, targets)
    model.train()
    return {k: measure.finite_or_none(v) for k, v in evaluator.compute().items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# One repeat
# ---------------------------------------------------------------------------------------------
def train_repeat(
    spec: TrainSpec,
    repeat: int,
    seeds: seeding.Seeds,
    out_dir: str | Path,
    *,
    dist: Dist | None = None,
    callbacks: Callbacks | None = None,
) -> dict[str, Any]:
    """Train one repeat; returns its summary (also written to ``out_dir/summary.json`` on rank 0)."""
    dist = dist or Dist()
    callbacks = callbacks or Callbacks()
    out_dir = Path(out_dir)
    writer = _RepeatFiles(out_dir) if dist.is_main else None
    mllog = _mlperf_logger(spec, out_dir, seeds, dist) if dist.is_main else None
    status, error = STATUS_COMPLETED, None
    summary: dict[str, Any] = {}
    try:
        if mllog:
            mllog.init_start()
        if spec.threads:
            torch.set_num_threads(int(spec.threads))
        set_determinism(spec.deterministic)
        seeding.apply(seeds)
        device = torch_device(spec.device, dist)
        task = Task(spec.workload)
        train_loader, eval_loader, info = build_data(spec, dist, seeds)
        if mllog:
            mllog.log_samples(len(train_loader.dataset), len(eval_loader.dataset))
        model = build_model(spec, info).to(device)
        compressor = compressor_spec(spec.compressor, seeds)
        train_model, hook_state = _wrap_ddp(model, compressor, dist, device)
        optimizer = build_optimizer(train_model.parameters(), spec.optimizer)
        if dist.engine == "horovod":
            from repro500.ext.horovod import distributed_optimizer

            optimizer = distributed_optimizer(optimizer, model, compressor)
            hook_state = optimizer
        base_lrs = [g["lr"] for g in optimizer.param_groups]
        steps_per_epoch = len(train_loader)

        flops_per_sample = _flops_per_sample(task, model, train_loader, device)
        if mllog:
            mllog.init_stop()
            mllog.run_start()

        metric_name, target_value = spec.target["metric"], float(spec.target["value"])
        direction = spec.target.get("direction", "higher")
        run_start = time.perf_counter()
        train_time_s = 0.0
        samples_seen = 0
        global_step = 0
        epochs_to_quality: int | None = None
        time_to_quality_s: float | None = None
        eval_metrics: dict[str, Any] = {}
        epoch_digests: list[str] = []
        epochs_run = 0
        traffic = Traffic()

        for epoch in range(1, spec.epochs + 1):
            train_loader.sampler.set_epoch(epoch)
            if callbacks.on_epoch_start:
                callbacks.on_epoch_start(epoch, steps_per_epoch)
            if mllog:
                mllog.epoch_start(epoch)
            step_records: list[dict[str, Any]] = []
            epoch_train_s = 0.0
            wire_start = wire.tcp_bytes() if dist.world_size > 1 else None
            t_mark = time.perf_counter()
            for i, (inputs, targets) in enumerate(train_loader):
                t_data = time.perf_counter()
                inputs, targets = _to_device(inputs, device), _to_device(targets, device)
                factor = lr_factor(spec.lr_schedule, epoch - 1 + i / steps_per_epoch, spec.epochs)
                for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
                    group["lr"] = base * factor
                if hook_state is not None and hasattr(hook_state, "set_learning_rate"):
                    hook_state.set_learning_rate(optimizer.param_groups[0]["lr"])  # EF-signSGD scales by lr
                _sync(device)
                t0 = time.perf_counter()
                loss = task.loss(train_model, inputs, targets)
                _sync(device)
                t1 = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                _sync(device)
                t2 = time.perf_counter()
                optimizer.step()
                _sync(device)
                t3 = time.perf_counter()
                loss_value = float(loss.detach())
                n = _batch_size(inputs) * dist.world_size
                samples_seen += n
                global_step += 1
                step_s = t3 - t_mark
                epoch_train_s += step_s
                record = {
                    "kind": "step", "repeat": repeat, "epoch": epoch, "step": global_step,
                    "loss": measure.finite_or_none(loss_value), "lr": optimizer.param_groups[0]["lr"],
                    "samples": n, "time_data_s": t_data - t_mark, "time_forward_s": t1 - t0,
                    "time_backward_s": t2 - t1, "time_optimizer_s": t3 - t2, "step_time_s": step_s,
                    "time_comm_s": None, "time_comm_wait_s": None, "time_compress_s": None,
                    "time_decompress_s": None, "bytes_sent": None, "bytes_received": None,
                    "dense_bytes_sent": None, "compression_ratio": None,
                    "peak_memory_bytes": measure.peak_memory_bytes(device), "wall_s": t3 - run_start,
                }
                if hook_state is not None:
                    if hasattr(hook_state, "comm_wait_s"):  # DDP: the backward pass ended at t2
                        record["time_comm_wait_s"] = hook_state.comm_wait_s(t2)
                    record.update(hook_state.step_stats())
                traffic.add(record)
                step_records.append(record)
                if writer:
                    writer.metric(record)
                if callbacks.on_step:
                    callbacks.on_step(record)
                if not _all_finite(loss_value, dist):
                    status = STATUS_DIVERGED
                    what = (f"loss became {loss_value}" if not math.isfinite(loss_value)
                            else "another rank's loss became non-finite")
                    error = f"{what} at epoch {epoch}, step {global_step}"
                    break
                t_mark = time.perf_counter()
            train_time_s += epoch_train_s
            epochs_run = epoch
            epoch_wire = _wire_per_rank(wire_start, dist, len(step_records)) if dist.world_size > 1 else None
            traffic.add_wire(epoch_wire)
            if mllog:
                mllog.epoch_stop(epoch)
            if status == STATUS_DIVERGED:
                # No evaluation, but the epoch is closed like any other, so that its steps up to
                # the divergence reach MLflow (the ddp engine replays callbacks from this file).
                diverged_record: dict[str, Any] = {
                    "kind": "epoch", "repeat": repeat, "epoch": epoch, "metrics": {}, "diverged": True,
                    "train_samples": samples_seen, "train_time_s": epoch_train_s,
                    "wall_s": time.perf_counter() - run_start, "wire": epoch_wire,
                }
                if writer:
                    writer.metric(diverged_record)
                if callbacks.on_epoch_end:
                    callbacks.on_epoch_end(diverged_record, step_records)
                break

            if mllog:
                mllog.eval_start(epoch)
            eval_metrics = (evaluate(task, model, eval_loader, device, info, spec.evaluate, spec.search_paths)
                            if dist.is_main else {})
            if mllog:
                mllog.eval_stop(epoch)
                mllog.log_eval(eval_metrics, epoch)
            reached = measure.target_reached(eval_metrics.get(metric_name), target_value, direction)
            reached = _broadcast_flag(reached, dist)
            wall_s = time.perf_counter() - run_start
            if reached and epochs_to_quality is None:
                epochs_to_quality, time_to_quality_s = epoch, wall_s
            epoch_record: dict[str, Any] = {
                "kind": "epoch", "repeat": repeat, "epoch": epoch, "metrics": eval_metrics,
                "train_samples": samples_seen, "train_time_s": epoch_train_s, "wall_s": wall_s,
                "wire": epoch_wire,
            }
            if dist.is_main:
                digest, tensors = measure.state_digests(model)
                epoch_digests.append(digest)
                epoch_record["param_digest"] = digest
                writer.params({"epoch": epoch, "digest": digest, "tensors": tensors})
                writer.metric(epoch_record)
            if callbacks.on_epoch_end:
                callbacks.on_epoch_end(epoch_record, step_records)
            if reached:
                break

        total_s = time.perf_counter() - run_start
        if mllog:
            mllog.run_stop(epochs_to_quality is not None)
        if dist.is_main:
            final_digest, tensors = measure.state_digests(model)
            writer.params({"epoch": "final", "digest": final_digest, "tensors": tensors})
            summary = _summarise(
                spec, repeat, seeds, status, error, epochs_run, epochs_to_quality, time_to_quality_s,
                train_time_s, total_s, samples_seen, flops_per_sample, eval_metrics, epoch_digests,
                final_digest, dist, traffic,
            )
    except KeyboardInterrupt:
        status = STATUS_KILLED
        if writer:
            writer.close()
        if mllog:
            mllog.run_stop(False)
        raise
    finally:
        if writer:
            writer.close()
        if mllog:
            mllog.close()
    if dist.is_main:
        atomic.write_json(out_dir / "summary.json", summary)
    return summary


def _summarise(
    spec: TrainSpec, repeat: int, seeds: seeding.Seeds, status: str, error: str | None, epochs_run: int,
    epochs_to_quality: int | None, time_to_quality_s: float | None, train_time_s: float, total_s: float,
    samples_seen: int, flops_per_sample: float | None, eval_metrics: dict[str, Any], epoch_digests: list[str],
    final_digest: str, dist: Dist, traffic: Traffic | None = None,
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


def _flops_per_sample(task: Task, model: torch.nn.Module, loader: Any, device: torch.device) -> float | None:
    """Training FLOPs per sample, counted on one batch drawn straight from the dataset.

    Indexing the dataset (not iterating the loader) leaves the loader's RNG untouched.
    """
    dataset = loader.dataset
    n = min(loader.batch_size or 1, len(dataset))
    items = [dataset[i] for i in range(n)]
    batch = loader.collate_fn(items) if loader.collate_fn else torch.utils.data.default_collate(items)
    inputs, targets = _to_device(batch[0], device), _to_device(batch[1], device)
    flops = measure.count_train_flops(model, lambda m: task.loss(m, inputs, targets))
    return flops / n if flops is not None else None


def compressor_spec(spec: Any, seeds: seeding.Seeds) -> dict[str, Any]:
    """The recipe's compressor as a dict, seeded from the repeat unless the recipe gives a seed.

    Rank 0's seed is used on every rank: random-k needs the same positions everywhere; the
    stochastic quantizers add the rank themselves.
    """
    from repro500.ext.compressors import PARAMETERS

    out = {"name": spec} if isinstance(spec, str) else dict(spec)
    if "seed" in PARAMETERS.get(str(out.get("name", "")).lower(), {}):
        out.setdefault("seed", seeding.derive(seeds.master, seeds.repeat, 0).torch % 2**31)
    return out


def _wrap_ddp(model: torch.nn.Module, compressor: dict[str, Any], dist: Dist,
              device: torch.device) -> tuple[torch.nn.Module, Any]:
    if dist.engine != "ddp" or dist.world_size <= 1:
        return model, None
    from torch.nn.parallel import DistributedDataParallel

    from repro500.ext import ddp_hook

    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return ddp, ddp_hook.register(ddp, compressor)


def _all_finite(loss_value: float, dist: Dist) -> bool:
    """Whether every rank's loss is finite.

    Decided together: a rank that stopped alone at its own NaN would leave the others
    waiting in the next step's gradient exchange.  One small collective per step, only
    when there are several ranks (CPU, so Gloo under a ``cpu:gloo,cuda:nccl`` group).
    """
    finite = math.isfinite(loss_value)
    if dist.world_size <= 1:
        return finite
    flag = torch.tensor([0.0 if finite else 1.0])
    if dist.engine == "horovod":
        import horovod.torch as hvd

        return float(hvd.allreduce(flag, op=hvd.Sum, name="repro500.nonfinite_loss")) == 0.0
    import torch.distributed as tdist

    tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
    return float(flag) == 0.0


def _wire_per_rank(start: tuple[int, int] | None, dist: Dist, steps: int) -> dict[str, Any] | None:
    """Every rank's TCP bytes since *start*, gathered on all ranks (a collective: every rank
    calls it after the same epoch); None when any rank could not read its counters."""
    end = wire.tcp_bytes() if start is not None else None
    mine = None if start is None or end is None else (end[0] - start[0], end[1] - start[1])
    if dist.engine == "horovod":
        import horovod.torch as hvd

        everyone = hvd.allgather_object(mine)
    else:
        import torch.distributed as tdist

        everyone = [None] * dist.world_size
        tdist.all_gather_object(everyone, mine)
    if any(r is None for r in everyone):
        return None
    return {"steps": steps, "bytes_sent": [r[0] for r in everyone], "bytes_received": [r[1] for r in everyone]}


def _broadcast_flag(flag: bool, dist: Dist) -> bool:
    if dist.world_size <= 1:
        return flag
    if dist.engine == "horovod":
        import horovod.torch as hvd

        return bool(hvd.broadcast_object(flag, root_rank=0))
    import torch.distributed as tdist

    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)
    tdist.broadcast(tensor, src=0)
    return bool(tensor.item())


def _mlperf_logger(spec: TrainSpec, out_dir: Path, seeds: seeding.Seeds, dist: Dist) -> Any:
    from repro500.workloads.mlperf import BENCHMARK_FOR_TASK, MLPerfLogger

    gpus = torch.cuda.device_count() if spec.device in ("cuda", "auto") and torch.cuda.is_available() else 0
    return MLPerfLogger(
        out_dir / "mllog.txt",
        benchmark=spec.mlperf_benchmark or BENCHMARK_FOR_TASK[spec.workload],
        seed=seeds.torch,
        global_batch_size=spec.batch_size * dist.world_size,
        optimizer=spec.optimizer,
        lr_schedule=spec.lr_schedule,
        epochs=spec.epochs,
        target=spec.target,
        world_size=dist.world_size,
        accelerators_per_node=gpus,
    )


class _RepeatFiles:
    """``metrics.jsonl`` and ``params.jsonl`` of a repeat, line-buffered so a crash keeps every
    finished line."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(out_dir / "metrics.jsonl", "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
        self._params = open(out_dir / "params.jsonl", "w", encoding="utf-8", buffering=1)  # noqa: SIM115

    def metric(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(record, allow_nan=False) + "\n")

    def params(self, record: dict[str, Any]) -> None:
        self._params.write(json.dumps(record, allow_nan=False) + "\n")

    def close(self) -> None:
        for fh in (self._metrics, self._params):
            if not fh.closed:
                fh.close()


def environment_for_determinism() -> None:
    """Set before CUDA initialises: cuBLAS needs a fixed workspace for deterministic GEMMs."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
