"""``repro500 ops --inference RECIPE``: a recipe's model, timed answering batches (Deep500's
latency, MLPerf Inference's single-stream view).

The model is built through the trainer's own door (``train.build_model`` on the recipe's
``fixed.model`` and ``model_options``, shaped by its data set's info: a built-in and a plug-in
alike), in eval mode, with the builder's seeded initial weights: latency does not depend on the
weights, except a detector's, whose post-processing keeps more or fewer boxes (docs/system.md).
Inputs are real samples of the recipe's data set (its eval split), stacked into batches.

Per batch size b: warm-up calls (untimed), then ``calls`` timed calls (stopping early, after at
least ``MIN_CALLS``, once ``budget_s`` is spent), each synchronised.  Reported: the batch latency's
p50/p90/p99 with distribution-free order-statistic intervals (repro500.verify.quantiles: a p99
interval needs at least 368 calls at 95 %), the per-sample latency (batch latency / b) and the
throughput b / median batch latency.  Batch 1 is the single-stream latency.

Correctness: one batch's outputs against the same model and inputs in float64 on the CPU,
normwise (max |y - r| / max |r|), accepted up to 1e-4 for float32: a broken kernel shows as
orders of magnitude more.  A detector's outputs are lists of boxes whose number may change with
the precision; they are not compared (the record says so).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput, UsageError
from repro500.recipe import load as recipes
from repro500.system import timing
from repro500.workloads import parts

DEFAULT_BATCH_SIZES = (1, 8, 32)
DEFAULT_CALLS = 400
MIN_CALLS = 20
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
OUTPUT_TOLERANCE = 1e-4  # max relative error of a float32 network's outputs against float64


@dataclass
class InferenceConfig:
    task: str
    model: str
    dataset: dict[str, Any]
    model_options: dict[str, Any] = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=lambda: list(DEFAULT_BATCH_SIZES))
    calls: int = DEFAULT_CALLS
    budget_s: float = 30.0
    search_paths: list[str] = field(default_factory=list)
    device: str = "cpu"

    @classmethod
    def from_recipe(cls, system: dict[str, Any], mutable: dict[str, Any], device: str) -> InferenceConfig:
        if int(mutable.get("nproc") or 1) > 1:
            raise UsageError("inference latency is measured on one process; leave --nproc out")
        missing = [key for key in ("task", "model", "dataset") if key not in system]
        if missing:
            raise InvalidInput(f"fixed.system of an inference recipe needs {', '.join(missing)} (docs/system.md)")
        return cls(task=str(system["task"]), model=str(system["model"]), dataset=dict(system["dataset"]),
                   model_options=dict(system.get("model_options") or {}),
                   batch_sizes=[int(b) for b in system.get("batch_sizes") or DEFAULT_BATCH_SIZES],
                   calls=int(system.get("calls") or DEFAULT_CALLS), budget_s=float(system.get("budget_s", 30.0)),
                   search_paths=[str(p) for p in system.get("search_paths") or []], device=device)


def options_from_recipe(path: Path, *, batch_sizes: list[int] | None = None, calls: int | None = None) -> dict[str, Any]:
    """``fixed.system`` for the model of the trained recipe at ``path`` (its model, options and data)."""
    recipe = recipes.load(path)
    if recipe.kind != "trained":
        raise InvalidInput(f"{path} is a {recipe.kind} recipe; --inference needs a recipe that trains a model")
    system: dict[str, Any] = {"recipe": str(path), "task": recipe.fixed["workload"], "model": recipe.fixed["model"],
                              "model_options": recipe.fixed.get("model_options") or {},
                              "dataset": recipe.fixed["dataset"], "search_paths": [str(Path(path).resolve().parent)],
                              "device": recipe.mutable.get("device", "cpu")}
    if batch_sizes:
        system["batch_sizes"] = batch_sizes
    if calls:
        system["calls"] = calls
    return system


def _spec(config: InferenceConfig) -> Any:
    from repro500.workloads.trainer import train

    return train.TrainSpec(workload=config.task, model=config.model, dataset=config.dataset, target={"metric": "-"},
                           epochs=1, model_options=config.model_options, device=config.device,
                           search_paths=config.search_paths)


def build(config: InferenceConfig) -> tuple[Any, Any]:
    """(the model in eval mode on the device, the eval data set): the trainer's door."""
    from repro500.workloads.trainer import train

    spec = _spec(config)
    dataset = parts.open_data(spec.dataset, "eval", paths=spec.search_paths)
    model = train.build_model(spec, dict(getattr(dataset, "info", {}) or {}))
    return model.eval().to(config.device), dataset


def check(config: InferenceConfig) -> list[str]:
    if not config.batch_sizes or any(b < 1 for b in config.batch_sizes):
        raise UsageError("batch sizes must be positive integers")
    if config.calls < 2:
        raise UsageError("--calls must be at least 2")
    build(config)  # an unknown model, a missing data set: one sentence now
    names = ["output_max_rel_err"] if config.task != "detection" else []
    for b in config.batch_sizes:
        names += [f"b{b}.{kind}.{q}_s" for kind in ("batch_latency", "sample_latency") for q in QUANTILES]
        names.append(f"b{b}.throughput_samples_per_s")
    return names


def acceptance(config: InferenceConfig) -> dict[str, dict[str, Any]]:
    if config.task == "detection":
        return {}
    return {"output_max_rel_err": {"target": 0.0, "direction": "lower", "tolerance": OUTPUT_TOLERANCE}}


def batch_of(dataset: Any, size: int, task: str) -> Any:
    import torch

    items = [dataset[i % len(dataset)] for i in range(size)]
    if task == "detection":
        return [image for image, _ in items]
    return torch.utils.data.default_collate([x for x, _ in items])


def _to(inputs: Any, device: Any, dtype: Any = None) -> Any:
    if isinstance(inputs, list):
        return [_to(x, device, dtype) for x in inputs]
    return inputs.to(device=device, dtype=dtype) if dtype is not None else inputs.to(device)


def output_error(model: Any, inputs: Any, device: str) -> float:
    """Normwise relative error of the model's outputs against itself in float64 on the CPU."""
    import torch

    reference = copy.deepcopy(model).to("cpu", torch.float64)
    with torch.inference_mode():
        got = model(_to(inputs, device)).to("cpu", torch.float64)
        ref = reference(_to(inputs, "cpu", torch.float64))
    scale = float(ref.abs().max())
    return float((got - ref).abs().max()) / scale if scale > 0 else float((got - ref).abs().max())


def latency(samples_s: list[float], batch: int) -> dict[str, Any]:
    from repro500.verify import quantiles

    out: dict[str, Any] = {"batch_size": batch, "calls": len(samples_s)}
    for name, q in QUANTILES.items():
        ci = quantiles.interval(samples_s, q, timing.ALPHA)
        out[f"{name}_s"], out[f"{name}_ci_s"] = ci["value"], [ci["low"], ci["high"]]
        out[f"{name}_ci"] = f"[{_short(ci['low'])}, {_short(ci['high'])}]"
        if ci["note"]:
            out.setdefault("notes", []).append(ci["note"])
    median = quantiles.point(samples_s, 0.5)
    out["throughput_samples_per_s"] = batch / median if median else None
    return out


def _short(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def run(config: InferenceConfig, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    torch.manual_seed(seed)
    model, dataset = build(config)
    sync = timing.synchronizer(config.device)
    metrics: dict[str, Any] = {}
    doc: dict[str, Any] = {"measure": "inference", "model": config.model, "task": config.task,
                           "device": config.device, "threads": torch.get_num_threads(), "math": "fp32 (TF32 off)",
                           "batches": [], "notes": []}
    # torch leaves cuDNN's TF32 on: a GPU's "fp32" convolutions would round to 10 mantissa bits, outputs
    # 1e-3 off float64 (past the tolerance), and the latency would not be fp32's either
    with timing.math_mode("fp32"):
        if config.task != "detection":
            err = output_error(model, batch_of(dataset, config.batch_sizes[0], config.task), config.device)
            metrics["output_max_rel_err"] = err
            doc["output_error"] = {"max_rel_err": err, "tolerance": OUTPUT_TOLERANCE, "reference": "float64 on the CPU"}
        else:
            doc["notes"].append("outputs not compared with float64: a detector's box lists may differ in length")
        _time_batches(config, model, dataset, sync, metrics, doc)
    return metrics, doc


def _time_batches(config: InferenceConfig, model: Any, dataset: Any, sync: Any, metrics: dict[str, Any],
                  doc: dict[str, Any]) -> None:
    import torch

    for b in config.batch_sizes:
        inputs = _to(batch_of(dataset, b, config.task), config.device)
        budget = timing.Budget(min_reps=min(config.calls, MIN_CALLS), max_reps=config.calls, budget_s=config.budget_s)
        with torch.inference_mode():
            t = timing.time_calls(lambda inputs=inputs: model(inputs), sync, budget)
        row = latency(t.times_s, b)
        doc["notes"] += [f"batch {b}: {note}" for note in row.pop("notes", [])]
        doc["batches"].append({**row, "warmup_calls": t.warmup_calls})
        for name in QUANTILES:
            metrics[f"b{b}.batch_latency.{name}_s"] = row[f"{name}_s"]
            metrics[f"b{b}.sample_latency.{name}_s"] = row[f"{name}_s"] / b if row[f"{name}_s"] else None
        metrics[f"b{b}.throughput_samples_per_s"] = row["throughput_samples_per_s"]
