"""Compressors under DDP on two Gloo ranks on every built-in model family, as a
user runs them (`repro500 run RECIPE --nproc 2 --set compressor.name=...`), each recorded byte
count equal to what repro500.scaling.wire's model predicts for the buckets DDP cut that step.

The families: torchvision's ResNets (resnet18, four DDP buckets), torchvision's Faster R-CNN
(ResNet-18 FPN backbone, four buckets) and the CosmoFlow 3D CNN; the CIFAR ResNets are covered
by test_powersgd_run.py and every compressor on a three-bucket CNN by test_ddp_hook.py.  NCCL
needs a GPU; docs/distributed.md says what runs where.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe

pytestmark = pytest.mark.slow  # each is a real two-rank run of a real model on 2 cores

COMMON = {"schema": "repro500/recipe/v1", "repeats": 1, "seed": 3,
          "mutable": {"optimizer": {"name": "adam", "lr": 0.0005}, "lr_schedule": {"name": "constant"},
                      "device": "cpu", "threads": 1}}
FAMILIES = {
    "resnet18": ({
        "name": "tinyresnet18",
        "fixed": {"workload": "classification", "model": "resnet18",
                  "model_options": {"small_input": True},
                  "dataset": {"name": "classification-h5", "path": "cls.h5", "eval_path": "cls-eval.h5"},
                  "target": {"metric": "accuracy", "value": 0.99, "direction": "higher"}, "epochs": 1},
        "mutable": {"batch_size": 8, "eval_batch_size": 16},
        "acceptance": {"accuracy": {"target": 0.0, "direction": "higher"}},
    }, [("classification", "cls.h5", ["--samples", "48", "--size", "16x16", "--classes", "4"]),
        ("classification", "cls-eval.h5", ["--samples", "16", "--size", "16x16", "--classes", "4", "--split", "eval"])]),
    "fasterrcnn_resnet18_fpn": ({
        "name": "tinydetection",
        "fixed": {"workload": "detection", "model": "fasterrcnn_resnet18_fpn",
                  "model_options": {"min_size": 64, "max_size": 96, "anchor_sizes": [8, 16, 32, 64, 128],
                                    "rpn_pre_nms_top_n": 50, "rpn_post_nms_top_n": 20,
                                    "box_batch_size_per_image": 16, "box_detections_per_img": 10},
                  "dataset": {"name": "ewa", "path": "ewa.h5", "eval_path": "ewa-eval.h5"},
                  "target": {"metric": "map_50", "value": 0.99, "direction": "higher"}, "epochs": 2},
        "mutable": {"batch_size": 2, "eval_batch_size": 4},
        "acceptance": {"map_50": {"target": 0.0, "direction": "higher"}},
    }, [("ewa", "ewa.h5", ["--samples", "8", "--size", "64x96"]),
        ("ewa", "ewa-eval.h5", ["--samples", "4", "--size", "64x96", "--split", "eval"])]),
    "cosmoflow": ({
        "name": "tinycosmoflow",
        "fixed": {"workload": "regression", "model": "cosmoflow",
                  "model_options": {"crop_size": 16, "base_channels": 4, "depth": 2, "fc1_size": 16, "fc2_size": 8},
                  "dataset": {"name": "cosmo", "path": "cosmo.h5", "eval_path": "cosmo-eval.h5",
                              "params": {"crop": 16}},
                  "target": {"metric": "mae", "value": 0.0, "direction": "lower"}, "epochs": 2},
        "mutable": {"batch_size": 4, "eval_batch_size": 8},
        "acceptance": {"mae": {"target": 1.0, "direction": "lower"}},
    }, [("cosmo", "cosmo.h5", ["--samples", "24", "--size", "16"]),
        ("cosmo", "cosmo-eval.h5", ["--samples", "8", "--size", "16", "--split", "eval"])]),
}


def _run(tmp: Path, family: str, *compressor: str, device: str = "cpu") -> tuple[Path, dict]:
    recipe, data = FAMILIES[family]
    for kind, out, args in data:
        made = repro500("data", "generate", kind, "--out", out, *args, "--seed", "3", cwd=tmp)
        assert made.returncode == 0, made.stderr
    write_recipe(tmp / "r.yaml", {**COMMON, **recipe, "mutable": {**COMMON["mutable"], **recipe["mutable"]}})
    settings = [item for pair in zip(["--set"] * len(compressor), compressor, strict=True) for item in pair]
    done = repro500("run", "r.yaml", "--nproc", "2", "--no-tracking", "--run-id", "c", "--set", f"device={device}",
                    *settings, cwd=tmp, timeout=1200)
    run = tmp / "runs" / "c"
    assert (run / "run.json").is_file(), done.stderr
    assert "RankFailed" not in done.stderr and "Traceback" not in done.stderr, done.stdout[-3000:] + done.stderr
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "completed" and meta["world_size"] == 2 and meta["engine"] == "ddp", done.stderr
    summary = json.loads((run / "repeats" / "0" / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    steps = [r for r in map(json.loads, (run / "repeats/0/metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    return run, {"steps": steps, "compressor": meta["compressor"], "recipe": recipe, "meta": meta}


def _model_shapes(recipe: dict) -> list[tuple[int, ...]]:
    """The trainable parameters' shapes, the model built as the run built it (the classes come from
    the data: 4 for the classification files, Extreme Weather's 4 + background for detection)."""
    from repro500.workloads.models import build_model

    options = dict(recipe["fixed"].get("model_options") or {})
    if recipe["fixed"]["workload"] == "classification":
        options["num_classes"] = 4
    model = build_model(recipe["fixed"]["model"], **options)
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def _wire_bytes(spec: dict, bucket_numels: list[int]) -> int:
    """What scaling.wire's model says one of 2 ranks sends for DDP's buckets of this step."""
    from repro500.scaling import wire

    planned = [wire.Bucket(n, 1, wire.payload_bytes(spec, n)) for n in bucket_numels]
    return wire.bytes_per_rank(planned, 2, wire.is_summable(spec))


@pytest.mark.parametrize(("family", "name", "extra"), [
    ("resnet18", "topk", ["compressor.ratio=0.01"]),  # sparse: values + indices, allgathered
    ("cosmoflow", "qsgd", []),  # quantised, allgathered with a norm per bucket
    ("cosmoflow", "randomk", []),  # sparse with a shared seed: summable
])
def test_a_compressor_on_a_built_in_family_sends_what_the_wire_model_says(in_tmp, family, name, extra):
    _, found = _run(in_tmp, family, f"compressor.name={name}", *extra)
    spec, steps = found["compressor"], found["steps"]
    params = sum(math.prod(shape) for shape in _model_shapes(found["recipe"]))
    assert len(steps) >= 2
    for step in steps:
        assert sum(step["bucket_numels"]) == params and step["tensors"] == len(step["bucket_numels"])
        assert step["compressed"] is True and step["bytes_sent"] == step["bytes_received"]
        assert step["bytes_sent"] == _wire_bytes(spec, step["bucket_numels"]), step
        assert step["dense_bytes_sent"] == 4 * params  # a plain allreduce on 2 ranks moves every float once
    if family == "resnet18":  # 11 M parameters: DDP cuts several buckets after the first step
        assert max(s["tensors"] for s in steps) >= 3


@pytest.mark.parametrize("family", ["fasterrcnn_resnet18_fpn", "resnet18"])
def test_powersgd_on_a_built_in_family_compresses_from_start_iter_with_the_wire_models_bytes(in_tmp, family):
    from repro500.scaling import wire

    _, found = _run(in_tmp, family, "compressor.name=powersgd", "compressor.start_iter=2")
    steps = found["steps"]
    compressed = wire.powersgd_payload_bytes(found["compressor"], _model_shapes(found["recipe"]))
    assert [s["compressed"] for s in steps[:3]] == [False, False, True] and len(steps) >= 3
    for step in steps[2:]:  # on 2 ranks an allreduce moves its payload once: P, Q and the rest
        assert step["compressed"] and step["bytes_sent"] == compressed and step["tensors"] >= 3, step
    assert all(s["bytes_sent"] == s["dense_bytes_sent"] for s in steps[:2])


GPUS = __import__("torch").cuda.device_count()


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason=f"NCCL needs two CUDA devices; this machine has {GPUS}")
def test_powersgd_over_nccl_on_two_gpus_sends_the_wire_models_bytes(in_tmp):
    """The NCCL path keeps PowerSGD's P/Q chain overlapped (ext/ddp_hook.py); its bytes are the same."""
    from repro500.scaling import wire

    _, found = _run(in_tmp, "cosmoflow", "compressor.name=powersgd", "compressor.start_iter=2", device="cuda")
    assert found["meta"]["distributed"]["backend"] == "nccl"
    compressed = wire.powersgd_payload_bytes(found["compressor"], _model_shapes(found["recipe"]))
    assert all(s["bytes_sent"] == compressed for s in found["steps"][2:]) and len(found["steps"]) >= 3
