"""repro500 roofline's memory bandwidth vs Debian's ``sysbench memory`` on the same bytes and
threads (target: within 15 %), side by side.

Per round, interleaved: repro500's read kernel (``sum`` of a float32 array) and write kernel
(``fill_``), as ``repro500 roofline`` times them (``roofline.bandwidth``), and
``sysbench memory --memory-oper=read|write`` with the same threads, each thread over a block of
the array's bytes / threads (``roofline.sysbench_memory``).  The figures are the medians over
rounds; the triad and copy figures (the roofline's ceiling) are printed beside them.  Use all
cores (the default, as ``repro500 roofline`` does): one thread does not saturate the memory, and
then the comparison is of the two loops' instructions (sysbench reads a word at a time), not of
the memory.

    python bench/roofline_bandwidth.py [--rounds 5] [--mib 256] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from repro500.system import roofline, timing

TARGET = 0.15


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=256, help="array size (MiB), as repro500 roofline's default")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if roofline.sysbench() is None:
        print("sysbench is not installed (apt-get install sysbench): nothing to compare with")
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    array = args.mib << 20
    budget = timing.Budget(budget_s=1.0)
    ours: dict[str, list[float]] = {k: [] for k in roofline.KERNELS}
    tool: dict[str, list[float]] = {"read": [], "write": []}
    for r in range(args.rounds):
        steps = ["ours", "tool"] if r % 2 == 0 else ["tool", "ours"]
        for step in steps:
            if step == "ours":
                for kernel, rec in roofline.bandwidth(array, "cpu", budget).items():
                    ours[kernel].append(rec["bytes_per_s"])
            else:
                for op in tool:
                    figure, how = roofline.sysbench_memory(op, array // threads, threads)
                    assert figure is not None, how
                    tool[op].append(figure)
    worst = 0.0
    for op in ("read", "write"):
        mine, theirs = statistics.median(ours[op]), statistics.median(tool[op])
        off = abs(mine / theirs - 1)
        worst = max(worst, off)
        print(f"{op:5s} repro500 {mine / 1e9:7.2f} GB/s   sysbench {theirs / 1e9:7.2f} GB/s   ratio {mine / theirs:.3f}")
    for kernel in ("copy", "triad"):
        print(f"{kernel:5s} repro500 {statistics.median(ours[kernel]) / 1e9:7.2f} GB/s   (no tool figure: STREAM's own kernel)")
    verdict = "OK" if worst <= TARGET else "MISSED"
    print(f"bandwidth on {threads} thread(s), {args.mib} MiB: largest disagreement with sysbench {worst:.3f} "
          f"(target <= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
