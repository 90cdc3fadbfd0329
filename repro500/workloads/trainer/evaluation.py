"""Evaluation metrics per task: sums and counts here, mAP by a maintained implementation (torchmetrics).

One small evaluator per task, created fresh for every evaluation pass::

    evaluator = make_evaluator(model_task(name), num_classes=10)
    for batch in eval_loader:
        evaluator.update(model(inputs), targets)
    metrics = evaluator.compute()   # {"accuracy": 0.91, "top5_accuracy": 0.99, "loss": 0.31}

``compute()`` returns plain Python floats under the names recipes use in ``acceptance``;
a value that is undefined (nothing evaluated, no ground truth of a class, a NaN from a
diverged model) is ``None``, never NaN.  Inputs may live on any device; evaluators move
them to the CPU, where the metric state lives (eval outputs are small next to the model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from repro500.errors import UsageError

# CosmoFlow's targets, in the order of the data files' ``unitPar``.
COSMO_PARAMETERS = ("omega_m", "sigma_8", "n_s", "h0")

# The metric each task's recipes usually name as their target (and direction).
PRIMARY_METRIC = {
    "classification": ("accuracy", "higher"),
    "detection": ("map_50", "higher"),
    "regression": ("mae", "lower"),
}


class Evaluator(Protocol):
    def update(self, outputs: Any, targets: Any) -> None: ...

    def compute(self) -> dict[str, float | None]: ...


def _plain(value: Any, *, undefined_below: float | None = None) -> float | None:
    """A tensor or number as a finite float, or None where it is undefined."""
    number = float(value)
    if not math.isfinite(number) or (undefined_below is not None and number < undefined_below):
        return None
    return number


def _cpu(tensor: Any) -> Any:
    return tensor.detach().cpu()


class _Sums:
    """Running float64 sums that ``compute()`` may add up over the ranks of a process group.

    Classification and regression are sums and counts; torchmetrics computes them too, but importing
    it costs about 6 s a process on two cores (its package imports every domain it covers:
    torchvision, and with it torch._dynamo, and scipy.signal), more than a small run trains.  Its
    ``MeanAveragePrecision`` is still used for detection, where the computation is not a sum.
    float64 accumulators: a long evaluation loses nothing to float32 running sums.
    """

    def __init__(self, names: Sequence[str], *, sync_ranks: bool) -> None:
        import torch

        self.names = tuple(names)
        self.values = torch.zeros(len(self.names), dtype=torch.float64)
        self.sync_ranks = sync_ranks

    def add(self, **amounts: Any) -> None:
        for name, amount in amounts.items():
            self.values[self.names.index(name)] += amount

    def totals(self) -> dict[str, float]:
        """The sums, over every rank of the initialised process group where ``sync_ranks``."""
        import torch.distributed as dist

        values = self.values
        if self.sync_ranks and dist.is_available() and dist.is_initialized():
            # NCCL reduces only device tensors; every other backend reduces CPU ones.
            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            values = values.to(device)
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values = values.cpu()
        return dict(zip(self.names, values.tolist(), strict=True))


def _ratio(total: float, count: float) -> float | None:
    return _plain(total / count) if count else None


class ClassificationEvaluator:
    """Top-1 (and top-5) accuracy and mean cross-entropy over every sample seen.

    ``update(logits, labels)``: logits (or probabilities) of shape (N, C), integer labels (N,).
    Accuracy is micro-averaged (correct samples over samples, as torchmetrics'
    ``MulticlassAccuracy(average="micro")``): a sample is top-k correct when its label is among the
    k largest outputs.  Top-5 accuracy is reported only when there are more than 5 classes (with 5
    or fewer it is 1.0 by construction).  A NaN loss surfaces as ``None``, never dropped.
    """

    def __init__(self, num_classes: int, *, sync_ranks: bool = False) -> None:
        if num_classes < 2:
            raise UsageError(
                f"classification needs at least 2 classes, got num_classes={num_classes}."
            )
        self.num_classes = num_classes
        self._top5 = num_classes > 5
        self._sums = _Sums(("samples", "top1", "top5", "loss"), sync_ranks=sync_ranks)
        self.samples = 0

    def update(self, outputs: Any, targets: Any) -> None:
        import torch.nn.functional as F

        logits, labels = _cpu(outputs).float(), _cpu(targets).long()
        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise UsageError(
                f"classification outputs must have shape (batch, {self.num_classes}), got {tuple(logits.shape)}."
            )
        # top-1 by argmax (the first of tied maxima, as torchmetrics counts it), top-5 by topk
        top1 = int((logits.argmax(dim=1) == labels).sum())
        top5 = int((logits.topk(5, dim=1).indices == labels[:, None]).any(dim=1).sum()) if self._top5 else 0
        losses = F.cross_entropy(logits, labels, reduction="none")
        self._sums.add(samples=labels.numel(), top1=top1, top5=top5, loss=float(losses.double().sum()))
        self.samples += labels.numel()

    def compute(self) -> dict[str, float | None]:
        names = ["accuracy", "loss"] + (["top5_accuracy"] if self._top5 else [])
        if not self.samples:
            return dict.fromkeys(names)
        sums = self._sums.totals()
        result = {"accuracy": _ratio(sums["top1"], sums["samples"]),
                  "loss": _ratio(sums["loss"], sums["samples"])}
        if self._top5:
            result["top5_accuracy"] = _ratio(sums["top5"], sums["samples"])
        return result


class DetectionEvaluator:
    """COCO-style box mAP: ``map`` (IoU 0.50:0.95), ``map_50``, ``map_75`` and AP@0.5 per class.

    ``update(detections, targets)`` takes torchvision's formats: lists (one entry per image)
    of dicts with ``boxes`` (x1, y1, x2, y2 pixels), ``labels`` and, for detections,
    ``scores``.  Labels count from 1; 0 is the background.  Per-class AP@0.5 appears as
    ``ap_50_<name>`` (``class_names[label - 1]``, or the label number) and is ``None`` for a
    class with no ground-truth box.  Computed by torchmetrics' ``MeanAveragePrecision``
    with the pycocotools backend (the COCO reference implementation).
    """

    def __init__(
        self,
        *,
        class_names: Sequence[str] | None = None,
        per_class: bool = True,
        sync_ranks: bool = False,
    ) -> None:
        from torchmetrics.detection import MeanAveragePrecision

        common = {
            "box_format": "xyxy",
            "iou_type": "bbox",
            "backend": "pycocotools",
            "sync_on_compute": sync_ranks,
        }
        self._coco = MeanAveragePrecision(**common)
        # A second pass at IoU 0.5 alone gives per-class AP@0.5, the EWA benchmark's metric;
        # torchmetrics' own per-class figure averages over all ten IoU thresholds.
        self._per_class = (
            MeanAveragePrecision(iou_thresholds=[0.5], class_metrics=True, **common)
            if per_class
            else None
        )
        self.class_names = list(class_names) if class_names is not None else None
        self.images = 0

    @staticmethod
    def _prepare(items: Sequence[Mapping[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
        return [{key: _cpu(item[key]) for key in keys} for item in items]

    def update(
        self, outputs: Sequence[Mapping[str, Any]], targets: Sequence[Mapping[str, Any]]
    ) -> None:
        if len(outputs) != len(targets):
            raise UsageError(
                f"detection evaluation got {len(outputs)} predictions for {len(targets)} images."
            )
        preds = self._prepare(outputs, ("boxes", "scores", "labels"))
        truth = self._prepare(targets, ("boxes", "labels"))
        self._coco.update(preds, truth)
        if self._per_class is not None:
            self._per_class.update(preds, truth)
        self.images += len(targets)

    def _class_name(self, label: int) -> str:
        if self.class_names is not None and 1 <= label <= len(self.class_names):
            return self.class_names[label - 1]
        return str(label)

    def compute(self) -> dict[str, float | None]:
        result: dict[str, float | None] = {"map": None, "map_50": None, "map_75": None}
        if self._per_class is not None:
            # Every named class gets a key, so summaries have the same keys in every repeat.
            for label in range(1, len(self.class_names or ()) + 1):
                result[f"ap_50_{self._class_name(label)}"] = None
        if not self.images:
            return result
        coco = self._coco.compute()
        # torchmetrics reports -1 where COCO's AP is undefined (no ground truth at all).
        result.update(
            {name: _plain(coco[name], undefined_below=0.0) for name in ("map", "map_50", "map_75")}
        )
        if self._per_class is not None:
            per_class = self._per_class.compute()
            classes = per_class["classes"].reshape(-1).tolist()
            values = per_class["map_per_class"].reshape(-1).tolist()
            for label, value in zip(classes, values, strict=True):
                result[f"ap_50_{self._class_name(int(label))}"] = _plain(value, undefined_below=0.0)
        return result


class RegressionEvaluator:
    """MSE and MAE over all parameters, and MAE and mean relative error per parameter.

    ``mae_<param>`` is each parameter's share of ``mae`` (their mean is ``mae``): which
    parameters a model has learned, e.g. CosmoFlow's n_s and H_0 apart from Omega_m and sigma_8.

    ``update(predictions, targets)``: tensors of shape (N, P) with P = len(param_names).
    ``rel_error_<param>`` is mean(|prediction - target| / max(|target|, 1.17e-6)) (MAPE as
    scikit-learn and torchmetrics define it, the epsilon guarding zero targets): with targets
    normalised around 0 it is dominated by near-zero targets, so MAE is the robust figure
    (CosmoFlow's MLPerf target is MAE <= 0.124 on the normalised parameters).
    """

    # scikit-learn's (and torchmetrics') lower bound on |target| in the relative error
    EPSILON = 1.17e-06

    def __init__(
        self, param_names: Sequence[str] = COSMO_PARAMETERS, *, sync_ranks: bool = False
    ) -> None:
        self.param_names = tuple(param_names)
        columns = [f"{kind}_{name}" for kind in ("abs", "rel") for name in self.param_names]
        self._sums = _Sums(("rows", "squared", *columns), sync_ranks=sync_ranks)
        self.samples = 0

    def update(self, outputs: Any, targets: Any) -> None:
        preds, truth = _cpu(outputs).float(), _cpu(targets).float()
        expected = len(self.param_names)
        if preds.shape != truth.shape or preds.ndim != 2 or preds.shape[1] != expected:
            raise UsageError(
                f"regression outputs and targets must both have shape (batch, {expected}), "
                f"got {tuple(preds.shape)} and {tuple(truth.shape)}."
            )
        error = preds.double() - truth.double()
        absolute = error.abs().sum(dim=0).tolist()
        relative = (error.abs() / truth.double().abs().clamp(min=self.EPSILON)).sum(dim=0).tolist()
        self._sums.add(rows=preds.shape[0], squared=float(error.square().sum()),
                       **{f"abs_{name}": value for name, value in zip(self.param_names, absolute, strict=True)},
                       **{f"rel_{name}": value for name, value in zip(self.param_names, relative, strict=True)})
        self.samples += preds.shape[0]

    def compute(self) -> dict[str, float | None]:
        names = (["mse", "mae"] + [f"mae_{name}" for name in self.param_names]
                 + [f"rel_error_{name}" for name in self.param_names])
        if not self.samples:
            return dict.fromkeys(names)
        sums = self._sums.totals()
        rows = sums["rows"]
        values = rows * len(self.param_names)
        result = {"mse": _ratio(sums["squared"], values),
                  "mae": _ratio(sum(sums[f"abs_{name}"] for name in self.param_names), values)}
        for name in self.param_names:
            result[f"mae_{name}"] = _ratio(sums[f"abs_{name}"], rows)
        for name in self.param_names:
            result[f"rel_error_{name}"] = _ratio(sums[f"rel_{name}"], rows)
        return result


def make_evaluator(
    task: str,
    *,
    num_classes: int | None = None,
    class_names: Sequence[str] | None = None,
    param_names: Sequence[str] = COSMO_PARAMETERS,
    sync_ranks: bool = False,
) -> Evaluator:
    """A fresh evaluator for ``task`` (see ``repro500.workloads.models.model_task``).

    ``num_classes`` is required for classification.  ``sync_ranks=True`` makes
    ``compute()`` gather the state of every rank of an initialised process group (every
    rank must then call it); the default evaluates what this process saw.
    """
    if task == "classification":
        if num_classes is None:
            raise UsageError("a classification evaluator needs num_classes.")
        return ClassificationEvaluator(num_classes, sync_ranks=sync_ranks)
    if task == "detection":
        return DetectionEvaluator(class_names=class_names, sync_ranks=sync_ranks)
    if task == "regression":
        return RegressionEvaluator(param_names, sync_ranks=sync_ranks)
    raise UsageError(f"unknown task {task!r}; valid tasks: {', '.join(PRIMARY_METRIC)}.")


# The built-in evaluators as the ``repro500.evaluators`` entry points a plug-in would register
# (pyproject.toml): a factory taking what it needs of the data set's info as keywords and
# returning an object with ``update(outputs, targets)`` and ``compute() -> dict``.
def classification(*, num_classes: int, sync_ranks: bool = False) -> Evaluator:
    return ClassificationEvaluator(num_classes, sync_ranks=sync_ranks)


def detection(*, class_names: Sequence[str] | None = None, sync_ranks: bool = False) -> Evaluator:
    return DetectionEvaluator(class_names=class_names, sync_ranks=sync_ranks)


def regression(*, sync_ranks: bool = False) -> Evaluator:
    return RegressionEvaluator(COSMO_PARAMETERS, sync_ranks=sync_ranks)
