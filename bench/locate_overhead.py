"""What the operator-recording mode of ``repro500 locate`` costs a training step (aim: <= 3x).

The quickstart's model and step (ResNet-20, batch 64, 32x32 CIFAR-shaped inputs, SGD with
momentum, one CPU process) built by the trainer itself (``RepeatState``), then steps timed
plain and under :class:`repro500.workloads.trainer.replay.OpRecorder` (every operator's output
hashed bit for bit, module paths and phases kept), rounds interleaved so that load on the
machine falls on both alike.  The ratio is the median recorded step over the median plain step.
The data are the quickstart's shape, drawn in memory (synthetic-classification), so the bench
needs no generated files.

    python bench/locate_overhead.py [--rounds 5] [--steps 8] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from repro500.capture import seeds as seeding
from repro500.workloads.trainer import train
from repro500.workloads.trainer.replay import OpRecorder
from repro500.workloads.workload import Progress

AIM = 3.0


def quickstart_spec(batches: int) -> train.TrainSpec:
    return train.TrainSpec(
        workload="classification", model="resnet20",
        dataset={"name": "synthetic-classification",
                 "params": {"train_samples": batches * 64, "eval_samples": 64, "size": "32x32", "seed": 500}},
        target={"metric": "accuracy", "value": 0.95, "direction": "higher"}, epochs=1, batch_size=64,
        eval_batch_size=256, optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005},
        lr_schedule={"name": "constant"}, device="cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="steps per round and mode")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = quickstart_spec(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        r = train.RepeatState(spec, 0, seeding.derive(500), Path(tmp), train.Dist(), Progress())
        r.start()
        batches = [(x, y) for x, y in r.train_loader]
        recorder = OpRecorder(r.model)
        recorder.optimizer_phase(r.optimizer)
        recorder.initial_state()

        def plain(x: torch.Tensor, y: torch.Tensor) -> None:
            r.step(x, y, len(x))

        def recorded(x: torch.Tensor, y: torch.Tensor) -> None:
            recorder.begin(recorder.current_step + 1, (x, y))
            with recorder.step():
                r.step(x, y, len(x))

        for fn in (plain, recorded):  # warm both paths (allocator, oneDNN primitives)
            fn(*batches[0])
        times: dict[str, list[float]] = {"plain": [], "recorded": []}
        for _ in range(args.rounds):
            for name, fn in (("plain", plain), ("recorded", recorded)):
                for x, y in batches:
                    t0 = time.perf_counter()
                    fn(x, y)
                    times[name].append(time.perf_counter() - t0)
        r.close()
    plain_s, recorded_s = statistics.median(times["plain"]), statistics.median(times["recorded"])
    per_step = len(recorder.records) / max(1, recorder.current_step)
    ratio = recorded_s / plain_s
    print(f"quickstart step (ResNet-20, batch 64, 32x32, {torch.get_num_threads()} thread(s)): "
          f"plain {plain_s * 1e3:.1f} ms, recorded {recorded_s * 1e3:.1f} ms "
          f"({per_step:.0f} records a step, {args.rounds} rounds x {args.steps} steps each)")
    print(f"recording-mode step ratio: {ratio:.2f}x (aim <= {AIM:g}x)")
    return 0 if ratio <= AIM else 1


if __name__ == "__main__":
    sys.exit(main())
