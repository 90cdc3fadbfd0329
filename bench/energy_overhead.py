"""What energy and utilization sampling costs a training step (target: <= 1 %), measured as
bench/overhead.py measures the trainer: the same trainer, model (ResNet-20), data and seed, with
and without the per-epoch meter (repro500.workloads.trainer.epochs), rounds interleaved, each timed from
outside as the interval between consecutive step ends (the ``on_step`` callback).

The meter samples in a background thread.  This machine may have no RAPL and no GPU, and then
the thread would not run at all; so that the figure is the cost of sampling, the meter reads a
powercap tree of RAPL-shaped files (package and DRAM zones, written once) with the real reader,
every ``--interval-s`` seconds (1 s is what runs do; 0.1 s shows the margin).

    python bench/energy_overhead.py [--rounds 5] [--steps 24] [--interval-s 1.0]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from overhead import spec_for

from repro500.capture import seeds as seeding
from repro500.workloads.trainer import epochs, train
from repro500.workloads.trainer.energy import EnergyMeter
from repro500.workloads.workload import Progress

TARGET = 1.01


def fake_powercap(root: Path) -> Path:
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram")):
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text("123456789\n")
        (root / zone / "max_energy_range_uj").write_text("262143328850\n")
    return root


def steps_of(spec: train.TrainSpec, seeds: seeding.Seeds, meter: EnergyMeter | None) -> tuple[list[float], int]:
    ends: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        progress = Progress(on_step=lambda _record: ends.append(time.perf_counter()))
        metered = epochs.EpochMeter(Path(tmp), meter=meter) if meter is not None else None
        if metered is not None:
            progress = metered.wrap(progress)
        train.train_repeat(spec, 0, seeds, Path(tmp), callbacks=progress)
        samples = sum(e["energy"]["samples"] for e in metered.epochs) if metered else 0
    return [b - a for a, b in zip(ends, ends[1:], strict=False)], samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the trainer (default: torch's)")
    args = parser.parse_args(argv)
    powercap = fake_powercap(Path(tempfile.mkdtemp(prefix="repro500-bench-powercap-")))
    spec = dataclasses.replace(spec_for(args.steps, args.batch), threads=args.threads)
    seeds = seeding.derive(7, 0, 0)
    steps_of(spec_for(2, args.batch), seeds, None)  # warm-up: imports, allocator, thread pools
    plain, metered, samples = [], [], 0
    for r in range(args.rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            meter = EnergyMeter(powercap=powercap, interval_s=args.interval_s) if on else None
            times, taken = steps_of(spec, seeds, meter)
            (metered if on else plain).extend(times)
            samples += taken
    p, m = statistics.median(plain), statistics.median(metered)
    ratio = m / p
    print(f"without the meter  median step {p * 1000:.2f} ms over {len(plain)} steps")
    print(f"with the meter     median step {m * 1000:.2f} ms over {len(metered)} steps "
          f"({samples} samples every {args.interval_s:g} s)")
    print(f"step-time ratio metered/plain = {ratio:.4f} (target <= {TARGET}) {'OK' if ratio <= TARGET else 'MISSED'}")
    # the same cost read directly, which machine noise cannot hide: one sample's time per interval
    meter = EnergyMeter(powercap=powercap, interval_s=3600).start()
    t0 = time.perf_counter()
    for _ in range(1000):
        meter._sample()
    per_sample_s = (time.perf_counter() - t0) / 1000
    meter.stop()
    print(f"one sample takes {per_sample_s * 1e6:.1f} us: {per_sample_s / args.interval_s:.2e} of the time at one "
          f"sample every {args.interval_s:g} s")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
