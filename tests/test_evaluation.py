"""Evaluation metrics against hand counts and numpy, accumulated over several batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from repro500.errors import UsageError
from repro500.workloads.trainer.evaluation import (
    COSMO_PARAMETERS,
    PRIMARY_METRIC,
    ClassificationEvaluator,
    DetectionEvaluator,
    RegressionEvaluator,
    make_evaluator,
)


def test_classification_accuracy_matches_a_manual_count_over_batches():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 10, generator=generator)
    labels = torch.randint(0, 10, (50,), generator=generator)
    evaluator = make_evaluator("classification", num_classes=10)
    for start in range(0, 50, 16):  # uneven last batch
        evaluator.update(logits[start : start + 16], labels[start : start + 16])
    result = evaluator.compute()

    correct = sum(
        int(row.argmax()) == int(label) for row, label in zip(logits, labels, strict=True)
    )
    in_top5 = sum(
        int(label) in row.topk(5).indices.tolist()
        for row, label in zip(logits, labels, strict=True)
    )
    assert result["accuracy"] == pytest.approx(correct / 50)
    assert result["top5_accuracy"] == pytest.approx(in_top5 / 50)
    # The evaluator's loss is float32 (per-sample cross-entropy, then a running mean); the reference
    # is float64.  Per sample, log-softmax over C classes errs by at most gamma_{C+8} (the shift, C
    # exps and a sum, a log, exp/log within 4 ulp) times 2 max|z| + log C + |z_y|; the mean of n
    # positive losses adds gamma_{n+1} times the mean.
    u, classes, n = 2.0**-24, logits.shape[1], len(labels)
    gamma = lambda k: k * u / (1 - k * u)  # noqa: E731
    size = 2 * logits.abs().amax(dim=1) + math.log(classes) + logits.gather(1, labels[:, None]).abs()[:, 0]
    exact = F.cross_entropy(logits.double(), labels).item()
    bound = gamma(classes + 8) * float(size.double().mean()) + gamma(n + 1) * exact
    assert result["loss"] == pytest.approx(exact, rel=0, abs=bound)
    assert all(type(value) is float for value in result.values())


def test_classification_without_top5_for_five_classes():
    evaluator = ClassificationEvaluator(5)
    evaluator.update(torch.eye(5), torch.tensor([0, 1, 2, 3, 0]))
    result = evaluator.compute()
    assert set(result) == {"accuracy", "loss"}
    assert result["accuracy"] == pytest.approx(4 / 5)


def test_classification_diverged_model_gives_none_not_nan():
    evaluator = ClassificationEvaluator(10)
    evaluator.update(torch.full((4, 10), float("nan")), torch.tensor([0, 1, 2, 3]))
    result = evaluator.compute()
    assert result["loss"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in result.values())


def test_classification_nothing_evaluated_is_all_none():
    assert ClassificationEvaluator(10).compute() == {
        "accuracy": None,
        "loss": None,
        "top5_accuracy": None,
    }


def test_classification_rejects_wrong_shape():
    with pytest.raises(UsageError, match=r"shape \(batch, 10\)"):
        ClassificationEvaluator(10).update(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))


BOXES = torch.tensor(
    [[10.0, 10.0, 40.0, 30.0], [60.0, 50.0, 90.0, 80.0], [100.0, 20.0, 140.0, 35.0]]
)
LABELS = torch.tensor([1, 2, 4])
NAMES = ["tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river"]


def test_detection_perfect_predictions_score_one():
    evaluator = DetectionEvaluator(class_names=NAMES)
    truth = [{"boxes": BOXES, "labels": LABELS}, {"boxes": BOXES[:1] + 5, "labels": LABELS[:1]}]
    preds = [
        {"boxes": BOXES.clone(), "scores": torch.tensor([0.9, 0.8, 0.7]), "labels": LABELS.clone()},
        {"boxes": BOXES[:1] + 5, "scores": torch.tensor([0.95]), "labels": LABELS[:1]},
    ]
    evaluator.update(preds[:1], truth[:1])
    evaluator.update(preds[1:], truth[1:])
    result = evaluator.compute()
    assert result["map_50"] == 1.0
    assert result["map"] == 1.0
    assert result["ap_50_tropical_depression"] == 1.0
    assert result["ap_50_atmospheric_river"] == 1.0
    assert result["ap_50_extratropical_cyclone"] is None  # no ground truth of that class


def test_detection_missed_box_scores_below_one():
    evaluator = make_evaluator("detection")
    evaluator.update(
        [
            {
                "boxes": BOXES[:2].clone(),
                "scores": torch.tensor([0.9, 0.8]),
                "labels": LABELS[:2].clone(),
            }
        ],
        [{"boxes": BOXES, "labels": LABELS}],
    )
    result = evaluator.compute()
    assert result["map_50"] < 1.0
    # Classes 1 and 2 are found exactly, class 4 is missed: COCO averages over classes.
    assert result["map_50"] == pytest.approx(2 / 3, abs=1e-3)
    assert result["ap_50_1"] == 1.0 and result["ap_50_4"] == 0.0


def test_detection_nothing_evaluated_is_none():
    result = DetectionEvaluator(class_names=NAMES).compute()
    assert result["map_50"] is None and result["map"] is None
    assert result["ap_50_tropical_cyclone"] is None


def test_regression_metrics_match_numpy():
    rng = np.random.default_rng(0)
    predictions = rng.uniform(-1, 1, size=(30, 4)).astype(np.float32)
    targets = rng.uniform(0.2, 1, size=(30, 4)).astype(np.float32) * rng.choice(
        [-1, 1], size=(30, 4)
    )
    evaluator = make_evaluator("regression")
    for start in (0, 7, 20):
        stop = {0: 7, 7: 20, 20: 30}[start]
        evaluator.update(
            torch.from_numpy(predictions[start:stop]), torch.from_numpy(targets[start:stop])
        )
    result = evaluator.compute()
    error = predictions.astype(np.float64) - targets
    # torchmetrics works in float32; the reference in float64.  Every metric is a mean of n
    # positive terms, each a few float32 roundings away from exact (subtract, then square or
    # divide: 2 u), summed in any order and divided by n: relative error <= gamma_{n+3}.
    gamma = lambda k: k * 2.0**-24 / (1 - k * 2.0**-24)  # noqa: E731
    every, column = gamma(predictions.size + 3), gamma(len(predictions) + 3)
    assert result["mse"] == pytest.approx(np.mean(error**2), rel=every)
    assert result["mae"] == pytest.approx(np.mean(np.abs(error)), rel=every)
    relative = np.mean(np.abs(error) / np.abs(targets), axis=0)
    absolute = np.mean(np.abs(error), axis=0)
    for index, name in enumerate(COSMO_PARAMETERS):
        assert result[f"rel_error_{name}"] == pytest.approx(relative[index], rel=column)
        assert result[f"mae_{name}"] == pytest.approx(absolute[index], rel=column)
    # equal in exact arithmetic (equal-size columns): both sides' bounds, plus float64's mean of 4
    assert np.mean([result[f"mae_{name}"] for name in COSMO_PARAMETERS]) == pytest.approx(
        result["mae"], rel=every + column + 1e-15)


def test_regression_custom_parameters_and_shape_check():
    evaluator = RegressionEvaluator(("a", "b"))
    evaluator.update(torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 2.0]]))
    assert evaluator.compute() == {"mse": 0.5, "mae": 0.5, "mae_a": 1.0, "mae_b": 0.0,
                                   "rel_error_a": 0.5, "rel_error_b": 0.0}
    with pytest.raises(UsageError, match=r"shape \(batch, 2\)"):
        evaluator.update(torch.zeros(3, 4), torch.zeros(3, 4))


def test_unknown_task_and_missing_classes_are_usage_errors():
    with pytest.raises(UsageError, match="unknown task 'segmentation'"):
        make_evaluator("segmentation")
    with pytest.raises(UsageError, match="needs num_classes"):
        make_evaluator("classification")


def test_primary_metrics_are_names_the_evaluators_return():
    returned = {
        "classification": ClassificationEvaluator(10).compute(),
        "detection": DetectionEvaluator().compute(),
        "regression": RegressionEvaluator().compute(),
    }
    for task, (metric, direction) in PRIMARY_METRIC.items():
        assert metric in returned[task]
        assert direction in ("higher", "lower")


def test_sums_agree_with_torchmetrics_on_ties_zero_targets_and_uneven_batches():
    """Classification and regression are computed here, not by torchmetrics (whose import costs
    seconds a process): they must give torchmetrics' figures, ties and zero targets included."""
    from torchmetrics import MeanAbsoluteError, MeanAbsolutePercentageError, MeanSquaredError
    from torchmetrics.classification import MulticlassAccuracy

    generator = torch.Generator().manual_seed(7)
    # rounded logits: many tied maxima, where top-1 must count the first of them, as argmax does
    logits = torch.randint(0, 3, (97, 12), generator=generator).float()
    labels = torch.randint(0, 12, (97,), generator=generator)
    ours = ClassificationEvaluator(12)
    top1 = MulticlassAccuracy(12, top_k=1, average="micro")
    for start in range(0, 97, 20):
        ours.update(logits[start : start + 20], labels[start : start + 20])
        top1.update(logits[start : start + 20], labels[start : start + 20])
    # both count hits over 97 samples: the same integer ratio, each rounded once
    assert ours.compute()["accuracy"] == pytest.approx(float(top1.compute()), rel=2.0**-23)

    preds = torch.randn(41, 4, generator=generator)
    truth = torch.randn(41, 4, generator=generator)
    truth[::5, 1] = 0.0  # the epsilon guard of the relative error
    regression = RegressionEvaluator(("a", "b", "c", "d"))
    theirs = {"mse": MeanSquaredError(), "mae": MeanAbsoluteError()}
    relative = [MeanAbsolutePercentageError() for _ in range(4)]
    for start in (0, 13, 30):
        chunk = slice(start, {0: 13, 13: 30, 30: 41}[start])
        regression.update(preds[chunk], truth[chunk])
        for metric in theirs.values():
            metric.update(preds[chunk], truth[chunk])
        for column, metric in enumerate(relative):
            metric.update(preds[chunk, column], truth[chunk, column])
    result = regression.compute()
    # torchmetrics sums float32 terms (a mean of n positive terms: relative error <= gamma_{n+3});
    # ours sums in float64, far inside that bound
    gamma = lambda k: k * 2.0**-24 / (1 - k * 2.0**-24)  # noqa: E731
    for name, metric in theirs.items():
        assert result[name] == pytest.approx(float(metric.compute()), rel=gamma(preds.numel() + 3))
    for column, name in enumerate("abcd"):
        assert result[f"rel_error_{name}"] == pytest.approx(float(relative[column].compute()),
                                                            rel=gamma(len(preds) + 3))


def _evaluate_on_rank(rank: int, init: str, logits, labels, preds, truth, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        classification, regression = ClassificationEvaluator(10, sync_ranks=True), RegressionEvaluator(sync_ranks=True)
        classification.update(logits[rank::2], labels[rank::2])
        regression.update(preds[rank::2], truth[rank::2])
        with open(f"{out}.{rank}", "w") as handle:
            json.dump({**classification.compute(), **regression.compute()}, handle)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sync_ranks_gives_every_rank_the_whole_set(tmp_path):
    """With ``sync_ranks`` every rank reports the figures of the union of what the ranks saw."""
    import json

    import torch.multiprocessing as mp

    generator = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(31, 10, generator=generator), torch.randint(0, 10, (31,), generator=generator)
    preds, truth = torch.randn(31, 4, generator=generator), torch.randn(31, 4, generator=generator) + 3
    out = str(tmp_path / "result")
    mp.spawn(_evaluate_on_rank, args=(f"file://{tmp_path / 'rendezvous'}", logits, labels, preds, truth, out),
             nprocs=2, join=True)
    whole_c, whole_r = ClassificationEvaluator(10), RegressionEvaluator()
    whole_c.update(logits, labels)
    whole_r.update(preds, truth)
    whole = {**whole_c.compute(), **whole_r.compute()}
    for rank in (0, 1):
        reported = json.loads((tmp_path / f"result.{rank}").read_text())
        assert reported.keys() == whole.keys()
        for name, value in whole.items():
            # the same float64 sums, added in another order: a few ulps of float64
            assert reported[name] == pytest.approx(value, rel=1e-12), name
