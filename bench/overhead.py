"""repro500's trainer vs a plain hand-written PyTorch loop: step-time ratio (target <= 1.01).

Same model (ResNet-20), same synthetic data, same seed, same DataLoader; the two loops are
interleaved round by round so that machine noise hits both alike. Both are timed from outside,
the same way: the interval between consecutive step ends, so everything a loop does per step
counts (waiting for data, and for the trainer its step record, the metrics.jsonl line, the
peak-memory query and the callbacks). The trainer's clock is its ``on_step`` callback, which it
calls once per step after writing the step's record; its own ``step_time_s`` leaves that
bookkeeping out and would flatter it.

    python bench/overhead.py [--rounds 5] [--steps 24] [--plugin]

``--plugin`` builds the trainer's model through the plug-in door (``module:callable`` from a
file outside repro500, exactly as a user's recipe names it) instead of the registered name:
the same ResNet-20, so the ratio says what the door costs (issue target: the same <= 1.01).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from repro500.capture import seeds as seeding
from repro500.data import open_dataset
from repro500.workloads.models import build_model
from repro500.workloads.trainer import train
from repro500.workloads.workload import Progress

TARGET = 1.01


PLUGIN = """
from repro500.workloads.models.cifar_resnet import cifar_resnet


def build(*, num_classes: int = 10, in_channels: int = 3):
    return cifar_resnet(20, num_classes=num_classes, in_channels=in_channels)
"""


def spec_for(steps: int, batch: int, model: str = "resnet20", paths: list[str] | None = None) -> train.TrainSpec:
    return train.TrainSpec(
        workload="classification", model=model, search_paths=paths or [],
        dataset={"name": "synthetic-classification",
                 "params": {"train_samples": steps * batch, "eval_samples": 64, "seed": 1}},
        target={"metric": "accuracy", "value": 1.01, "direction": "higher"}, epochs=1,
        batch_size=batch, eval_batch_size=64, optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9},
        lr_schedule={"name": "constant"}, device="cpu",
    )


def plain_loop(spec: train.TrainSpec, seeds: seeding.Seeds) -> list[float]:
    """What a user would write by hand: no measurement beyond the step timer."""
    seeding.apply(seeds)
    params = {k: v for k, v in spec.dataset["params"].items() if k != "seed"}
    dataset = open_dataset("synthetic-classification", "train", seed=1, params=params)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True,
                                                  seed=seeds.loader % 2**62, drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=spec.batch_size, sampler=sampler, drop_last=True)
    model = build_model("resnet20", num_classes=10, in_channels=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    times = []
    mark = time.perf_counter()
    for inputs, labels in loader:
        loss = criterion(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        float(loss.detach())
        now = time.perf_counter()
        times.append(now - mark)
        mark = now
    return times[1:]  # the first step pays for allocations both loops make once


def trainer_loop(spec: train.TrainSpec, seeds: seeding.Seeds) -> list[float]:
    ends: list[float] = []
    callbacks = Progress(on_step=lambda _record: ends.append(time.perf_counter()))
    with tempfile.TemporaryDirectory() as tmp:
        train.train_repeat(spec, 0, seeds, Path(tmp), callbacks=callbacks)
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    assert len(ends) == sum(r["kind"] == "step" for r in records)
    # intervals between step ends: steps 2..n, as the plain loop returns
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--plugin", action="store_true", help="the trainer's model through the plug-in door")
    args = parser.parse_args(argv)
    model, paths = "resnet20", []
    if args.plugin:
        where = Path(tempfile.mkdtemp(prefix="repro500-bench-plugin-"))
        (where / "benchnets.py").write_text(PLUGIN)
        model, paths = "benchnets:build", [str(where)]
    spec = spec_for(args.steps, args.batch, model, paths)
    seeds = seeding.derive(7, 0, 0)
    trainer_loop(spec_for(2, args.batch), seeds)  # warm-up: imports, allocator, thread pools
    plain, ours = [], []
    for r in range(args.rounds):
        order = (plain_loop, trainer_loop) if r % 2 == 0 else (trainer_loop, plain_loop)
        for fn in order:
            (plain if fn is plain_loop else ours).extend(fn(spec, seeds))
    p, o = statistics.median(plain), statistics.median(ours)
    ratio = o / p
    verdict = "OK" if ratio <= TARGET else "MISSED"
    print(f"plain loop  median step {p * 1000:.2f} ms over {len(plain)} steps")
    print(f"repro500    median step {o * 1000:.2f} ms over {len(ours)} steps (model {model})")
    print(f"step-time ratio repro500/plain = {ratio:.4f} (target <= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
