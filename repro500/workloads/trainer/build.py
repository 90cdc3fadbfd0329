"""The trainer's building blocks: device, determinism, data loaders, model, loss and evaluation.

Each is a function of the resolved recipe (:class:`~repro500.workloads.trainer.spec.TrainSpec`); the
loop in ``train.py`` and the system measurements (``repro500 ops --inference``, the per-epoch
meters) build through the same doors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from repro500.capture import seeds as seeding
from repro500.workloads import parts, plugins
from repro500.workloads.models import build_model as factory
from repro500.workloads.models import model_options
from repro500.workloads.trainer import metrics as measure
from repro500.workloads.trainer import sampling
from repro500.workloads.trainer.spec import Dist, TrainSpec


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


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def batch_size(inputs: Any) -> int:
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
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

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
    # i is exactly the single-process batch i of world_size times the size. Rank 0's seed as this
    # repeat uses it, not as its index would derive it: a factorial cell that holds the loader seed
    # must hold the data order too.
    sampler = DistributedSampler(train_set, num_replicas=dist.world_size, rank=dist.rank, shuffle=True,
                                 seed=seeds.shuffle, drop_last=True)
    common = {"num_workers": spec.workers, "worker_init_fn": seeding.seed_worker, "collate_fn": collate,
              "persistent_workers": spec.workers > 0}
    # The loader draws its batches through a recorder, so each epoch's sampling can be checked
    # (workloads/sampling.py); the batches are BatchSampler's, as DataLoader(sampler=...) makes them.
    batches = sampling.RecordingBatches(BatchSampler(sampler, spec.batch_size, drop_last=True))
    train_loader = DataLoader(train_set, batch_sampler=batches, generator=generator, **common)
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
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            outputs = task.predict(model, inputs)
            evaluator.update(outputs, targets)
    model.train()
    return {k: measure.finite_or_none(v) for k, v in evaluator.compute().items()}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------

def flops_per_sample(task: Task, model: torch.nn.Module, loader: Any, device: torch.device,
                     batch: int) -> float | None:
    """Training FLOPs per sample, counted on one batch drawn straight from the dataset.

    Indexing the dataset (not iterating the loader) leaves the loader's RNG untouched.
    """
    dataset = loader.dataset
    n = min(batch, len(dataset))
    items = [dataset[i] for i in range(n)]
    collated = loader.collate_fn(items) if loader.collate_fn else torch.utils.data.default_collate(items)
    inputs, targets = to_device(collated[0], device), to_device(collated[1], device)
    flops = measure.count_train_flops(model, lambda m: task.loss(m, inputs, targets))
    return flops / n if flops is not None else None
