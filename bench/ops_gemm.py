"""repro500 ops' fp32 GEMM at its largest default size vs numpy's matmul on the same shape
(target: >= 0.90 of numpy's FLOP/s), measured side by side in one process.

Three figures per round, the rounds interleaved so that machine noise hits each alike:

* numpy: ``a @ b`` on float32, numpy's BLAS threads set to torch's (threadpoolctl), timed the
  same way (median of timed calls after warm-up, repro500.system.timing);
* torch: a bare ``torch.matmul`` loop, 2 n^3 / median call time, no harness;
* repro500 ops: ``repro500.system.ops.measure_case`` on the case ``matmul.fp32.cpu.NxNxN``, the
  code path of ``repro500 ops`` (its inputs, its error check, its timed calls).

ops / numpy is the target (numpy's BLAS may not be torch's: torch ships MKL, numpy OpenBLAS);
ops / torch is what the harness itself costs.

    python bench/ops_gemm.py [--rounds 5] [--n 2048] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from repro500.system import ops, timing
from repro500.system.operators import Case

TARGET = 0.90


def numpy_flops(n: int, threads: int, budget: timing.Budget) -> float:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    with threadpool_limits(limits=threads, user_api="blas"):
        t = timing.time_calls(lambda: a @ b, lambda: None, budget)
    return 2.0 * n**3 / t.median_s


def torch_flops(n: int, budget: timing.Budget) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(budget.warmup):
        torch.matmul(a, b)
    times = []
    while len(times) < budget.min_reps or sum(times) < budget.budget_s:
        t0 = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t0)
    return 2.0 * n**3 / statistics.median(times)


def ops_flops(n: int, budget: timing.Budget) -> float:
    record = ops.measure_case(Case("matmul", "fp32", "cpu", (("m", n), ("n", n), ("k", n))), 0, budget)
    assert record["error"]["err_eps"] <= record["tolerance_eps"], record["error"]  # the case also checks its error
    return record["flops_per_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=2048, help="the largest default matmul size of repro500 ops")
    parser.add_argument("--threads", type=int, default=None, help="torch (and numpy's BLAS) threads")
    parser.add_argument("--budget-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    budget = timing.Budget(budget_s=args.budget_s)
    figures: dict[str, list[float]] = {"numpy": [], "torch": [], "ops": []}
    runs = {"numpy": lambda: numpy_flops(args.n, threads, budget), "torch": lambda: torch_flops(args.n, budget),
            "ops": lambda: ops_flops(args.n, budget)}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            figures[name].append(runs[name]())
    med = {name: statistics.median(values) for name, values in figures.items()}
    for name, label in (("numpy", "numpy matmul (its BLAS)"), ("torch", "bare torch.matmul"), ("ops", "repro500 ops")):
        print(f"{label:24s} {med[name] / 1e9:8.1f} GFLOP/s  (rounds: {', '.join(f'{v / 1e9:.1f}' for v in figures[name])})")
    ratio = med["ops"] / med["numpy"]
    verdict = "OK" if ratio >= TARGET else "MISSED"
    print(f"fp32 GEMM {args.n}^3 on {threads} thread(s): repro500 ops / numpy = {ratio:.3f} (target >= {TARGET}) {verdict}")
    print(f"harness cost: repro500 ops / bare torch.matmul = {med['ops'] / med['torch']:.3f}")
    return 0 if ratio >= TARGET else 1  # make bench names a benchmark that missed by its exit status


if __name__ == "__main__":
    sys.exit(main())
