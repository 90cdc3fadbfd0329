"""The all-reduce of the ddp engine (torch.distributed: Gloo on CPUs, NCCL on GPUs), timed on P
ranks and checked against a float64 sum.

P processes join a group on 127.0.0.1 (``torch.multiprocessing.spawn``, as ``repro500 model``
times its collectives).  For each dtype and message size: each rank draws its own N(0, 1)
message (seeded by the run's seed and its rank), warms up, then times all-reduces each started
right after a barrier; a repetition's time is the slowest rank's (the collective is done when
every rank is).  Rank 0 checks one result against the float64 sum of every rank's rounded
message, which it draws again from the same seeds.  bytes/s is the bus bandwidth of
nccl-tests: message bytes x 2 (P - 1) / P / time, the bytes each rank moves in a ring.
"""

from __future__ import annotations

from typing import Any

from repro500.scaling import group
from repro500.system import timing
from repro500.system.operators import DTYPES, ITEMSIZE, Case, error, tolerance_for

MiB = 1 << 20


def sizes_up_to(gradient_bytes: int, smallest: int = 4096, factor: int = 4) -> list[int]:
    """Message sizes from a few KiB, a factor 4 apart, up to the model's gradient (included)."""
    sizes, size = [], smallest
    while size < gradient_bytes:
        sizes.append(size)
        size *= factor
    sizes.append(max(int(gradient_bytes), smallest))
    return sizes


def _message(seed: int, rank: int, numel: int, dtype: str, device: Any) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randn(numel, generator=gen, dtype=torch.float64).to(DTYPES[dtype]).to(device)


def _case(rank: int, world: int, case: Case, seed: int, budget: timing.Budget, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    numel = case.dims["bytes"] // ITEMSIZE[case.dtype]
    original = _message(seed, rank, numel, case.dtype, device)
    buffer = original.clone()
    sync = timing.synchronizer(device)

    def once() -> float:
        return group.timed(lambda: dist.all_reduce(buffer), prepare=lambda: buffer.copy_(original), sync=sync)

    once()
    result = buffer.detach().to("cpu", torch.float64)
    times = group.slowest_times(once, warmup=budget.warmup, min_reps=budget.min_reps, max_reps=budget.max_reps,
                                budget_s=budget.budget_s)
    if rank != 0:
        return {}
    total = sum(_message(seed, r, numel, case.dtype, "cpu").to(torch.float64) for r in range(world))
    t = timing.summarize(times, max(1, budget.warmup))
    moved = case.dims["bytes"] * 2.0 * (world - 1) / world
    return {"id": case.id, "op": case.op, "dtype": case.dtype, "device": case.device, "shape": case.dims,
            "ranks": world, "time": t.as_dict(), "flops": None, "bytes": moved,
            "flops_per_s": None, "bytes_per_s": moved / t.median_s if t.median_s > 0 else None,
            "error": error([result], [total], case.dtype), "tolerance_eps": tolerance_for(world)}


def _cases(rank: int, world: int, device: Any, backend: str, cases: list[Case], seed: int,
           budget: timing.Budget) -> list[dict[str, Any]]:
    records = []
    for case in cases:
        try:
            records.append(_case(rank, world, case, seed, budget, device))
        except RuntimeError as err:  # a dtype the backend cannot reduce: every rank fails alike
            records.append({"id": case.id, "skipped": f"{backend} cannot all-reduce {case.dtype}: "
                                                      f"{str(err).splitlines()[0]}"})
    return [r for r in records if r]


def measure(cases: list[Case], world: int, backend: str, seed: int, budget: timing.Budget) -> list[dict[str, Any]]:
    """Time every all-reduce case on ``world`` processes; one record per case (or why it was not)."""
    return group.run(_cases, world, (backend, cases, seed, budget), backend=backend, what=f"the {backend} all-reduce")
