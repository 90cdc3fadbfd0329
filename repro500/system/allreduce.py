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

import json
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from repro500.errors import RunFailed
from repro500.rundir import atomic
from repro500.system import timing
from repro500.system.operators import DTYPES, ITEMSIZE, Case, error, tolerance_for

TIMEOUT_S = 120
MiB = 1 << 20


def sizes_up_to(gradient_bytes: int, smallest: int = 4096, factor: int = 4) -> list[int]:
    """Message sizes from a few KiB, a factor 4 apart, up to the model's gradient (included)."""
    sizes, size = [], smallest
    while size < gradient_bytes:
        sizes.append(size)
        size *= factor
    sizes.append(max(int(gradient_bytes), smallest))
    return sizes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
        buffer.copy_(original)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buffer)
        sync()
        return time.perf_counter() - t0

    first = max(once() for _ in range(max(1, budget.warmup)))
    result = buffer.detach().to("cpu", torch.float64)
    reps = torch.tensor([min(budget.max_reps, max(budget.min_reps, int(budget.budget_s / max(first, 1e-9))))])
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # every rank runs the same number of collectives
    times = torch.tensor([once() for _ in range(int(reps))], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's time, per repetition
    if rank != 0:
        return {}
    total = sum(_message(seed, r, numel, case.dtype, "cpu").to(torch.float64) for r in range(world))
    t = timing.summarize(times.tolist(), max(1, budget.warmup))
    moved = case.dims["bytes"] * 2.0 * (world - 1) / world
    return {"id": case.id, "op": case.op, "dtype": case.dtype, "device": case.device, "shape": case.dims,
            "ranks": world, "time": t.as_dict(), "flops": None, "bytes": moved,
            "flops_per_s": None, "bytes_per_s": moved / t.median_s if t.median_s > 0 else None,
            "error": error([result], [total], case.dtype), "tolerance_eps": tolerance_for(world)}


def _worker(rank: int, world: int, port: int, backend: str, cases: list[Case], seed: int,
            budget: timing.Budget, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core per rank, as a DDP rank on a shared CPU
    device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    records = []
    try:
        for case in cases:
            try:
                records.append(_case(rank, world, case, seed, budget, device))
            except RuntimeError as err:  # a dtype the backend cannot reduce: every rank fails alike
                records.append({"id": case.id, "skipped": f"{backend} cannot all-reduce {case.dtype}: "
                                                          f"{str(err).splitlines()[0]}"})
        if rank == 0:
            atomic.write_json(out_path, [r for r in records if r])
    finally:
        dist.destroy_process_group()


def measure(cases: list[Case], world: int, backend: str, seed: int, budget: timing.Budget) -> list[dict[str, Any]]:
    """Time every all-reduce case on ``world`` processes; one record per case (or why it was not)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="repro500-allreduce-") as tmp:
        out_path = Path(tmp) / "allreduce.json"
        try:
            mp.spawn(_worker, args=(world, _free_port(), backend, cases, seed, budget, str(out_path)),
                     nprocs=world, join=True)
            return json.loads(out_path.read_text(encoding="utf-8"))
        except Exception as err:  # a failing rank surfaces as ProcessRaisedException
            detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise RunFailed(f"timing the {backend} all-reduce on {world} processes failed ({detail}); "
                            "check that 127.0.0.1 accepts local TCP connections") from None
