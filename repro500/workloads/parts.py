"""A trained workload's parts — data set, evaluator — found through the plug-in door.

The trainer, the distributed workers and the runner's checks before training all build them
here, so a recipe's ``fixed.dataset`` and ``fixed.evaluate`` mean the same thing everywhere,
whether they name a built-in or a plug-in (docs/workloads.md, "Plug-ins").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from repro500.data.loaders import DATASETS
from repro500.errors import InvalidInput
from repro500.workloads import plugins


def dataset_ref(dataset: dict[str, Any]) -> tuple[str, str]:
    """(recipe key, reference) of ``fixed.dataset``: ``name`` or a plug-in's ``entry``."""
    if dataset.get("entry"):
        return "fixed.dataset.entry", str(dataset["entry"])
    return "fixed.dataset.name", str(dataset.get("name"))


def open_data(dataset: dict[str, Any], split: str, *, paths: Iterable[str] = ()) -> Any:
    """The ``split`` ("train" or "eval") of ``fixed.dataset``: the factory is called as
    ``factory(split, path=..., seed=..., **params)`` (``seed`` is the data's, from params)."""
    key, ref = dataset_ref(dataset)
    factory = plugins.resolve("dataset", ref, key=key, paths=paths)
    params = dict(dataset.get("params") or {})
    seed = int(params.pop("seed", 0))  # the data is part of the benchmark: same for every repeat
    path = (dataset.get("eval_path") or dataset.get("path")) if split == "eval" else dataset.get("path")
    if ref in DATASETS:  # repro500's own: its errors are already sentences, its bugs tracebacks
        data = factory(split, path=path, seed=seed, **params)
    else:
        data = plugins.call(factory, key, ref, split, path=path, seed=seed, **params)
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise InvalidInput(f"{key}: {ref!r} returned a {type(data).__name__}, not a map-style torch Dataset "
                           "(__getitem__ and __len__)")
    return data


def evaluator_ref(workload: str, evaluate: str | None) -> tuple[str, str]:
    return ("fixed.evaluate", evaluate) if evaluate else ("fixed.workload", workload)


def make_evaluator(workload: str, evaluate: str | None, info: dict[str, Any], *, sync_ranks: bool = False,
                   paths: Iterable[str] = ()) -> Any:
    """A fresh evaluator: ``fixed.evaluate`` when given, else the built-in one of the task.

    The factory gets the keywords it takes of ``num_classes``, ``class_names`` (from the data
    set's info) and ``sync_ranks``; it returns an object with ``update(outputs, targets)`` and
    ``compute() -> {name: value}``.  ``compute()`` before any update must return every name it
    reports (values ``None``): that is how metric names are checked before training.
    """
    key, ref = evaluator_ref(workload, evaluate)
    factory = plugins.resolve("evaluator", ref, key=key, paths=paths)
    kwargs: dict[str, Any] = {"sync_ranks": sync_ranks}
    if info.get("num_classes") is not None or workload == "classification":
        kwargs["num_classes"] = int(info.get("num_classes") or 2)
    if info.get("class_names"):
        kwargs["class_names"] = list(info["class_names"])
    evaluator = plugins.call(factory, key, ref, **kwargs)
    if not (callable(getattr(evaluator, "update", None)) and callable(getattr(evaluator, "compute", None))):
        raise InvalidInput(f"{key}: {ref!r} returned a {type(evaluator).__name__}, which has no update() and compute(); "
                           "an evaluator factory returns an object with both (docs/workloads.md)")
    return evaluator


def evaluation_metrics(workload: str, evaluate: str | None, info: dict[str, Any], *, paths: Iterable[str] = ()) -> list[str]:
    """The metric names the evaluator reports, asked of the evaluator itself (built as the trainer
    builds it, computed on nothing), so this list cannot drift from what training reports."""
    key, ref = evaluator_ref(workload, evaluate)
    evaluator = make_evaluator(workload, evaluate, info, paths=paths)
    try:
        names = evaluator.compute()
    except Exception as err:  # noqa: BLE001 - a plug-in's compute() on nothing
        raise InvalidInput(f"{key}: {ref!r}: compute() before any update raised {type(err).__name__} ({err}); "
                           "it must return every metric name with value None") from None
    if not isinstance(names, dict) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidInput(f"{key}: {ref!r}: compute() must return a dict of metric name to value, got {names!r}")
    return list(names)
