"""The training variants' costs, through the trainer's own step and runs:

    python bench/variants.py [--steps 12] [--skip-sync]

1. Micro-batching: the quickstart model (ResNet-20, batch 64, 32x32 inputs, the CPU) stepped by
   ``workloads.step.Step`` with ``micro_batch_size`` = 16 (4 parts) against the whole batch,
   alternating the two so that machine drift falls on both.  Target: <= 1.10x the step time.
2. bf16 autocast on the CPU: the same step in ``amp-bf16`` against fp32.  No target (it depends
   on the CPU's bf16 units, printed beside it).
3. Local SGD: two real 2-rank ``repro500 run``s of a small ResNet-20 run, ``sync`` average every
   8 steps against DDP, the bytes each rank sent per step measured on its TCP sockets (the
   kernel's tcp_info, as runs record it and as bench/wire_bytes.py measures).  Target: <= 1/8.

Exit status: 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from repro500.workloads.models import build_model
from repro500.workloads.trainer.build import Task
from repro500.workloads.trainer.step import Step

MICRO_TARGET = 1.10
SYNC_TARGET = 1 / 8


def _step_times(precision: str, micro: int | None, steps: int, batch: int = 64) -> list[float]:
    torch.manual_seed(0)
    model = build_model("resnet20", num_classes=10, in_channels=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = Step(Task("classification"), model, opt, torch.device("cpu"), precision, micro)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    step(x, y, batch)  # warm-up: allocations, kernel choice
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, y, batch)
        times.append(time.perf_counter() - t0)
    return times


def _alternate(a: tuple[str, int | None], b: tuple[str, int | None], steps: int, rounds: int = 3) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(rounds):
        ta += _step_times(*a, steps)
        tb += _step_times(*b, steps)
    return statistics.median(ta), statistics.median(tb)


def _bf16_support() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.is_file() else ""
    units = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return (f"CPU capability {torch.backends.cpu.get_cpu_capability()}; bf16 units: "
            f"{', '.join(units) if units else 'none (bf16 is converted to fp32 for arithmetic)'}")


def _sync_bytes(tmp: Path) -> tuple[float | None, float | None]:
    recipe = {
        "schema": "repro500/recipe/v1", "name": "syncbench",
        "fixed": {"workload": "classification", "model": "resnet20",
                  "dataset": {"name": "synthetic-classification",
                              "params": {"train_samples": 1024, "eval_samples": 128, "size": "16x16", "seed": 3}},
                  "target": {"metric": "accuracy", "value": 0.99}, "epochs": 1},
        "mutable": {"batch_size": 16, "eval_batch_size": 128, "device": "cpu", "threads": 1},
        "acceptance": {"accuracy": {"target": 0.1, "direction": "higher", "tolerance": 0.1}},
        "repeats": 1, "seed": 1,
    }
    (tmp / "r.yaml").write_text(yaml.safe_dump(recipe))
    out = []
    for run_id, extra in (("ddp", []), ("avg8", ["--set", "sync.mode=average", "--set", "sync.every=8"])):
        proc = subprocess.run([sys.executable, "-m", "repro500.cli", "run", "r.yaml", "--nproc", "2", "--no-tracking",
                               "--run-id", run_id, *extra], cwd=tmp, capture_output=True, text=True)
        if proc.returncode not in (0, 1, 3):
            print(proc.stderr[-2000:], file=sys.stderr)
            return None, None
        summary = json.loads((tmp / "runs" / run_id / "repeats/0/summary.json").read_text())
        out.append(summary["metrics"].get("wire_bytes_sent_per_step"))
    return out[0], out[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per round (3 rounds, alternating)")
    parser.add_argument("--skip-sync", action="store_true", help="leave out the two 2-rank runs")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    ok = True

    full, parts = _alternate(("fp32", None), ("fp32", 16), args.steps)
    ratio = parts / full
    met = ratio <= MICRO_TARGET
    ok &= met
    print(f"micro-batching: batch 64 as 4 x 16 {parts * 1e3:.1f} ms/step vs whole {full * 1e3:.1f} ms/step = "
          f"{ratio:.3f}x (target <= {MICRO_TARGET}: {'met' if met else 'MISSED'})")

    fp32, bf16 = _alternate(("fp32", None), ("amp-bf16", None), args.steps)
    print(f"bf16 autocast on the CPU: {bf16 * 1e3:.1f} ms/step vs fp32 {fp32 * 1e3:.1f} ms/step; throughput "
          f"{fp32 / bf16:.3f}x of fp32 (no target; {_bf16_support()})")

    if not args.skip_sync:
        with tempfile.TemporaryDirectory() as tmp:
            ddp, avg = _sync_bytes(Path(tmp))
        if ddp and avg is not None:
            share = avg / ddp
            met = share <= SYNC_TARGET
            ok &= met
            print(f"local SGD, H = 8: {avg:,.0f} B/step/rank on TCP vs DDP {ddp:,.0f} = {share:.4f} = 1/{1 / share:.1f} "
                  f"(target <= 1/8: {'met' if met else 'MISSED'})")
        else:
            ok = False
            print("local SGD, H = 8: not measured (the runs failed, or ss could not read the sockets): MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
