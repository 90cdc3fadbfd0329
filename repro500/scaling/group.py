"""P processes of this machine in one torch.distributed group on 127.0.0.1, timing collectives.

``repro500 model`` (the alpha-beta coefficients, :mod:`repro500.scaling.measure`) and ``repro500
allreduce`` (:mod:`repro500.system.allreduce`) both time collectives this way, so the rules live
here once: each process is a rank started by ``torch.multiprocessing.spawn`` with one thread (a
DDP rank on a shared CPU); a repetition starts right after a barrier; its time is the slowest
rank's (the collective is done when every rank is), and every rank runs the same number of
repetitions, as many as fit the time budget within bounds.  Rank 0's records come back; a rank
that fails is one sentence (:class:`repro500.errors.RunFailed`).
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from repro500.errors import RunFailed
from repro500.rundir import atomic

TIMEOUT_S = 120  # a collective that hangs this long means the group is broken


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def run(worker: Callable[..., list[dict[str, Any]]], world: int, args: tuple[Any, ...], *, backend: str = "gloo",
        what: str) -> list[dict[str, Any]]:
    """``worker(rank, world, device, *args)`` in *world* ranks of a *backend* group; rank 0's records.
    *worker* is a module-level function (spawn pickles it); *what* names the measurement in the
    sentence a failure becomes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="repro500-group-") as tmp:
        out_path = Path(tmp) / "rank0.json"
        try:
            mp.spawn(_rank, args=(world, free_port(), backend, worker, args, str(out_path)), nprocs=world, join=True)
            return list(json.loads(out_path.read_text(encoding="utf-8")))
        except Exception as err:  # a failing rank surfaces as ProcessRaisedException
            detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise RunFailed(f"timing {what} on {world} processes failed ({detail}); "
                            "check that 127.0.0.1 accepts local TCP connections") from None


def _rank(rank: int, world: int, port: int, backend: str, worker: Callable[..., list[dict[str, Any]]],
          args: tuple[Any, ...], out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core per rank, as a DDP rank on a shared CPU
    device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        records = worker(rank, world, device, *args)
        if rank == 0:
            atomic.write_json(out_path, records)
    finally:
        dist.destroy_process_group()


def timed(call: Callable[[], Any], *, prepare: Callable[[], Any] = lambda: None,
          sync: Callable[[], Any] = lambda: None) -> float:
    """Seconds one collective takes on this rank: *prepare* (untimed), a barrier, then *call*
    until *sync* says the device is done."""
    import torch.distributed as dist

    prepare()
    sync()
    dist.barrier()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start


def slowest_times(once: Callable[[], float], *, warmup: int, min_reps: int, max_reps: int,
                  budget_s: float) -> list[float]:
    """Each repetition's time as the slowest rank saw it.  *warmup* untimed calls decide how many
    repetitions fit *budget_s* (at least *min_reps*, at most *max_reps*: a shared machine's noise
    hits short calls hardest), the same count on every rank."""
    import torch
    import torch.distributed as dist

    first = max(once() for _ in range(max(1, warmup)))
    reps = torch.tensor([min(max_reps, max(min_reps, int(budget_s / max(first, 1e-9))))])
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # every rank must run the same count
    times = torch.tensor([once() for _ in range(int(reps))], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return [float(t) for t in times.tolist()]
