"""The per-rank entry point of distributed repeats: ``python -m repro500.workloads.engines.worker JOB``.

Started by torchrun (``ddp``) or horovodrun (``horovod``) from :mod:`launch`.  Each rank joins the
process group, derives its own seeds (rank r of repeat k), records its host and device, and runs
the same trainer as a single process; rank 0 writes the repeat's files, including ``ranks.json``:
the rank -> host / device map with every rank's hardware facet.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from repro500.capture import seeds as seeding
from repro500.rundir import atomic, layout
from repro500.workloads.trainer import train


def _rank_record(dist: train.Dist, device: str) -> dict[str, Any]:
    record: dict[str, Any] = {"rank": dist.rank, "local_rank": dist.local_rank, "host": socket.gethostname(),
                              "pid": os.getpid(), "device": device,
                              "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_"))}}
    try:
        from repro500.capture import hardware

        record["hardware"] = hardware.hardware()
    except Exception as err:  # noqa: BLE001 - a rank's hardware facet failing must not stop training
        record["hardware_error"] = f"{type(err).__name__}: {err}"
    return record


def _group_backend(use_cuda: bool) -> str:
    """The process group's backends: NCCL for the gradients on a GPU, and Gloo beside it for the
    trainer's small CPU collectives (the divergence flag, the target-reached broadcast), which
    an NCCL-only group refuses ("no backend type associated with device type cpu")."""
    return "cpu:gloo,cuda:nccl" if use_cuda else "gloo"


def _init_ddp(job: dict[str, Any]) -> train.Dist:
    import torch
    import torch.distributed as tdist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = job["spec"]["device"] in ("cuda", "auto") and torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    tdist.init_process_group(_group_backend(use_cuda), timeout=timedelta(seconds=int(job.get("timeout_s", 300))))
    return train.Dist(rank=rank, world_size=world, local_rank=local, backend=backend, engine="ddp")


def _init_horovod(job: dict[str, Any]) -> train.Dist:
    import horovod.torch as hvd

    hvd.init()
    return train.Dist(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(),
                      backend=horovod_backend(job["spec"]["device"], bool(hvd.nccl_built())), engine="horovod")


def horovod_backend(device: str, nccl_built: bool) -> str:
    """What moves Horovod's gradients: NCCL for tensors on a GPU when Horovod was built with it
    (scripts/build_horovod.sh does so on a GPU machine), else Gloo."""
    import torch

    on_gpu = device in ("cuda", "auto") and torch.cuda.is_available()
    return "horovod-nccl" if on_gpu and nccl_built else "horovod-gloo"


def _gather(record: dict[str, Any], dist: train.Dist) -> list[dict[str, Any]]:
    if dist.engine == "ddp":
        import torch.distributed as tdist

        out: list[Any] = [None] * dist.world_size
        tdist.all_gather_object(out, record)
        return out
    import horovod.torch as hvd

    return hvd.allgather_object(record)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    dist = _init_ddp(job) if job["engine"] == "ddp" else _init_horovod(job)
    spec = train.TrainSpec(**job["spec"])
    varied = job.get("seed_varied")
    seeds = seeding.derive_varied(int(job["master_seed"]), int(job["seed_repeat"]), dist.rank,
                                  tuple(varied) if varied is not None else None)
    out_dir = Path(job["out_dir"])
    ranks = _gather(_rank_record(dist, spec.device), dist)
    if dist.is_main:
        atomic.write_json(out_dir / layout.RANKS, {"schema": "repro500/ranks/v1", "backend": dist.backend,
                                                   "world_size": dist.world_size, "ranks": ranks})
    try:
        train.train_repeat(spec, int(job["repeat"]), seeds, out_dir, dist=dist)
    finally:
        if dist.engine == "ddp":
            import torch.distributed as tdist

            if tdist.is_initialized():
                tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
