"""The trainer: one readable PyTorch loop for every workload.

One call of :func:`train_repeat` is one repeat: it builds data, model and optimizer from the
resolved recipe (seeded), then trains epoch by epoch until the target quality is reached
(time-to-quality) or the epoch budget is spent.  :func:`train_one_epoch` is the loop itself, on
one screen, torchvision's reference ``train_one_epoch`` its model: each concern is a call.

* the step (forward, backward, optimizer; precision and micro-batches) is ``step.Step``;
* the records (``metrics.jsonl`` per step with its time split into data / forward / backward /
  communication / optimizer, ``params.jsonl`` per epoch, the MLPerf log, the runner's callbacks),
  divergence, evaluation, sampling bias and the summary are ``repeat.RepeatState``'s;
* the parts (device, data, model, loss, evaluation) are built in ``blocks``.

The repeat's ``summary.json`` is written last, atomically: a repeat without one did not finish.
Distributed engines call the same function with a :class:`Dist`; only rank 0 writes files.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from repro500.capture import seeds as seeding
from repro500.workloads.trainer.build import (  # noqa: F401 - the trainer's doors, used by the runner and system measures
    Task,
    build_data,
    build_model,
    evaluate,
    set_determinism,
    to_device,
    torch_device,
)
from repro500.workloads.trainer.build import batch_size as batch_len
from repro500.workloads.trainer.repeat import RepeatState
from repro500.workloads.trainer.spec import (  # noqa: F401 - where callers have always found them
    Dist,
    TrainSpec,
)
from repro500.workloads.workload import Progress


def train_one_epoch(r: RepeatState, epoch: int) -> list[dict[str, Any]]:
    """Train one epoch; its step records.  Stops early when the loss diverges."""
    steps: list[dict[str, Any]] = []
    r.epoch_start(epoch)
    t_mark = time.perf_counter()
    for i, (inputs, targets) in enumerate(r.train_loader):
        t_data = time.perf_counter()
        inputs, targets = to_device(inputs, r.device), to_device(targets, r.device)
        r.set_lr(epoch, i)
        n = batch_len(inputs)
        times = r.step(inputs, targets, n)
        steps.append(r.record_step(epoch, times, n, t_mark, t_data))
        if r.diverged:
            break
        t_mark = time.perf_counter()
    return steps


def train_repeat(
    spec: TrainSpec,
    repeat: int,
    seeds: seeding.Seeds,
    out_dir: str | Path,
    *,
    dist: Dist | None = None,
    callbacks: Progress | None = None,
) -> dict[str, Any]:
    """Train one repeat; returns its summary (also written to ``out_dir/summary.json`` on rank 0)."""
    r = RepeatState(spec, repeat, seeds, Path(out_dir), dist or Dist(), callbacks or Progress())
    try:
        r.start()
        for epoch in range(1, spec.epochs + 1):
            steps = train_one_epoch(r, epoch)
            if r.end_epoch(epoch, steps):  # diverged, or the target quality is reached
                break
        r.finish()
    except KeyboardInterrupt:
        r.interrupted()
        raise
    finally:
        r.close()
    return r.write_summary()
