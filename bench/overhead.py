"""repro500's trainer vs a plain hand-written PyTorch loop: step-time ratio (target <= 1.01).

Same model (ResNet-20), same synthetic data, same seed, same DataLoader; the two loops are
interleaved step by step: the plain loop is a generator, and one of its steps runs inside the
trainer's ``on_step`` callback, between two of the trainer's steps. On a shared 2-core VM a
round's steps drift by 20% and more from one second to the next (rounds of whole loops gave
per-round ratios from 0.81 to 1.24 on the same code); pairing each trainer step with the plain
step just before it lets that drift hit both alike. Both are timed from outside: a plain step
from ``next()`` to its return, a trainer step from the end of the plain step before it to its
own ``on_step``, so everything the trainer does per step counts (waiting for data, its step
record, the metrics.jsonl line, the peak-memory query, the callbacks before ``on_step`` and
what it does after the callback returns). The trainer's own ``step_time_s`` leaves that
bookkeeping out and would flatter it; the bench prints it separately.

    python bench/overhead.py [--rounds 5] [--steps 24] [--plugin]

``--plugin`` builds the trainer's model through the plug-in door (``module:callable`` from a
file outside repro500, exactly as a user's recipe names it) instead of the registered name:
the same ResNet-20, so the ratio says what the door costs (issue target: the same <= 1.01).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
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


def plain_steps(spec: train.TrainSpec, seeds: seeding.Seeds) -> Iterator[float]:
    """What a user would write by hand, one step per ``next()``: no measurement at all.

    It yields after each step so that the bench can run one of its steps between two of the
    trainer's; the data repeat epoch after epoch so that it never runs out first.
    """
    seeding.apply(seeds)
    params = {k: v for k, v in spec.dataset["params"].items() if k != "seed"}
    dataset = open_dataset("synthetic-classification", "train", seed=1, params=params)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True,
                                                  seed=seeds.loader % 2**62, drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=spec.batch_size, sampler=sampler, drop_last=True)
    model = build_model("resnet20", num_classes=10, in_channels=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = criterion(model(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            yield float(loss.detach())


def paired_round(spec: train.TrainSpec, seeds: seeding.Seeds) -> tuple[list[float], list[float], list[float]]:
    """One trainer repeat with a plain step run between each two of its steps.

    Returns the plain steps' times, the trainer's intervals from the end of the plain step before
    to its own step end (data, compute, its step record, the metrics.jsonl line and every callback
    before ``on_step``; what it does after ``on_step`` falls in its next interval), and the
    trainer's bookkeeping per step (its interval less what its own record says data, forward,
    backward and the optimizer took).
    """
    plain = plain_steps(spec, seeds)
    next(plain)  # the first step pays for allocations both loops make once
    plain_times: list[float] = []
    ours: list[float] = []
    bookkeeping: list[float] = []
    resume = [0.0]

    def on_step(record: dict) -> None:
        now = time.perf_counter()
        if record["step"] > 1:  # the trainer's first step pays for its allocations
            ours.append(now - resume[0])
            work = sum(record[k] for k in ("time_data_s", "time_forward_s", "time_backward_s", "time_optimizer_s"))
            bookkeeping.append(ours[-1] - work)
        t0 = time.perf_counter()
        next(plain)
        resume[0] = time.perf_counter()
        plain_times.append(resume[0] - t0)

    with tempfile.TemporaryDirectory() as tmp:
        train.train_repeat(spec, 0, seeds, Path(tmp), callbacks=Progress(on_step=on_step))
    plain.close()
    return plain_times[:-1], ours, bookkeeping


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
    paired_round(spec_for(2, args.batch), seeds)  # warm-up: imports, allocator, thread pools
    plain: list[float] = []
    ours: list[float] = []
    kept: list[float] = []
    per_round: list[float] = []
    for _ in range(args.rounds):
        p, o, b = paired_round(spec, seeds)
        plain.extend(p)
        ours.extend(o)
        kept.extend(b)
        per_round.append(statistics.median(o) / statistics.median(p))
    p, o = statistics.median(plain), statistics.median(ours)
    ratio = o / p
    verdict = "OK" if ratio <= TARGET else "MISSED"
    print(f"plain loop  median step {p * 1000:.2f} ms over {len(plain)} steps")
    print(f"repro500    median step {o * 1000:.2f} ms over {len(ours)} steps (model {model})")
    print(f"repro500's bookkeeping per step (its step time less data, forward, backward, optimizer): "
          f"median {statistics.median(kept) * 1000:.3f} ms, {statistics.median(kept) / p:.2%} of a plain step")
    print(f"per-round ratios: {', '.join(f'{r:.3f}' for r in per_round)} "
          f"(min {min(per_round):.3f}, max {max(per_round):.3f})")
    print(f"step-time ratio repro500/plain = {ratio:.4f} (target <= {TARGET}) {verdict}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
