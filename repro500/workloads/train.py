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

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from repro500 import atomic
from repro500 import rundir as layout
from repro500.capture import seeds as seeding
from repro500.workloads import metrics as measure
from repro500.workloads import parts, plugins, records
from repro500.workloads.engines import collectives, wire
from repro500.workloads.optim import build_optimizer, lr_factor

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
        from repro500.data import collate_detection

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
    writer = records.RepeatFiles(out_dir) if dist.is_main else None
    mllog = records.mlperf_logger(spec, out_dir, seeds, dist) if dist.is_main else None
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
        compressor = records.compressor_spec(spec.compressor, seeds)
        comm = collectives.for_engine(dist.engine, dist.world_size)
        train_model, optimizer, hook_state = comm.wrap(
            model, lambda params: build_optimizer(params, spec.optimizer), compressor, device)
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
        traffic = records.Traffic()

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
                    "dense_bytes_sent": None, "compression_ratio": None, "compressed": None,
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
                if not comm.all_finite(loss_value):
                    status = STATUS_DIVERGED
                    what = (f"loss became {loss_value}" if not math.isfinite(loss_value)
                            else "another rank's loss became non-finite")
                    error = f"{what} at epoch {epoch}, step {global_step}"
                    break
                t_mark = time.perf_counter()
            train_time_s += epoch_train_s
            epochs_run = epoch
            epoch_wire = comm.wire_per_rank(wire_start, len(step_records))
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
            reached = comm.broadcast_flag(reached)
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
            summary = records.summarise(
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
        atomic.write_json(out_dir / layout.REPEAT_SUMMARY, summary)
    return summary


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
