"""Evaluation metrics per task, computed by maintained implementations (torchmetrics).

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


class ClassificationEvaluator:
    """Top-1 (and top-5) accuracy and mean cross-entropy over every sample seen.

    ``update(logits, labels)``: logits (or probabilities) of shape (N, C), integer labels (N,).
    Top-5 accuracy is reported only when there are more than 5 classes (with 5 or fewer it
    is 1.0 by construction).
    """

    def __init__(self, num_classes: int, *, sync_ranks: bool = False) -> None:
        from torchmetrics import MeanMetric
        from torchmetrics.classification import MulticlassAccuracy

        if num_classes < 2:
            raise UsageError(
                f"classification needs at least 2 classes, got num_classes={num_classes}."
            )
        common = {"sync_on_compute": sync_ranks}
        self.num_classes = num_classes
        self._top1 = MulticlassAccuracy(num_classes, top_k=1, average="micro", **common)
        self._top5 = (
            MulticlassAccuracy(num_classes, top_k=5, average="micro", **common)
            if num_classes > 5
            else None
        )
        # "disable": a NaN loss must surface (as None), not be silently dropped.
        self._loss = MeanMetric(nan_strategy="disable", **common)
        self.samples = 0

    def update(self, outputs: Any, targets: Any) -> None:
        import torch.nn.functional as F

        logits, labels = _cpu(outputs).float(), _cpu(targets).long()
        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise UsageError(
                f"classification outputs must have shape (batch, {self.num_classes}), got {tuple(logits.shape)}."
            )
        self._top1.update(logits, labels)
        if self._top5 is not None:
            self._top5.update(logits, labels)
        self._loss.update(F.cross_entropy(logits, labels, reduction="none"))
        self.samples += labels.numel()

    def compute(self) -> dict[str, float | None]:
        names = ["accuracy", "loss"] + (["top5_accuracy"] if self._top5 is not None else [])
        if not self.samples:
            return dict.fromkeys(names)
        result = {"accuracy": _plain(self._top1.compute()), "loss": _plain(self._loss.compute())}
        if self._top5 is not None:
            result["top5_accuracy"] = _plain(self._top5.compute())
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
    ``rel_error_<param>`` is mean(|prediction - target| / |target|) (torchmetrics' MAPE,
    which guards |target| with a tiny epsilon): with targets normalised around 0 it is
    dominated by near-zero targets, so MAE is the robust figure (CosmoFlow's MLPerf target
    is MAE <= 0.124 on the normalised parameters).
    """

    def __init__(
        self, param_names: Sequence[str] = COSMO_PARAMETERS, *, sync_ranks: bool = False
    ) -> None:
        from torchmetrics import MeanAbsoluteError, MeanAbsolutePercentageError, MeanSquaredError

        common = {"sync_on_compute": sync_ranks}
        self.param_names = tuple(param_names)
        self._mse = MeanSquaredError(**common)
        self._mae = MeanAbsoluteError(**common)
        self._relative = [MeanAbsolutePercentageError(**common) for _ in self.param_names]
        self._absolute = [MeanAbsoluteError(**common) for _ in self.param_names]
        self.samples = 0

    def update(self, outputs: Any, targets: Any) -> None:
        preds, truth = _cpu(outputs).float(), _cpu(targets).float()
        expected = len(self.param_names)
        if preds.shape != truth.shape or preds.ndim != 2 or preds.shape[1] != expected:
            raise UsageError(
                f"regression outputs and targets must both have shape (batch, {expected}), "
                f"got {tuple(preds.shape)} and {tuple(truth.shape)}."
            )
        self._mse.update(preds, truth)
        self._mae.update(preds, truth)
        for column, metric in enumerate(self._relative):
            metric.update(preds[:, column], truth[:, column])
        for column, metric in enumerate(self._absolute):
            metric.update(preds[:, column], truth[:, column])
        self.samples += preds.shape[0]

    def compute(self) -> dict[str, float | None]:
        names = (["mse", "mae"] + [f"mae_{name}" for name in self.param_names]
                 + [f"rel_error_{name}" for name in self.param_names])
        if not self.samples:
            return dict.fromkeys(names)
        result = {"mse": _plain(self._mse.compute()), "mae": _plain(self._mae.compute())}
        for name, metric in zip(self.param_names, self._absolute, strict=True):
            result[f"mae_{name}"] = _plain(metric.compute())
        for name, metric in zip(self.param_names, self._relative, strict=True):
            result[f"rel_error_{name}"] = _plain(metric.compute())
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
