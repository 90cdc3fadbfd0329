"""Where each rank of a distributed repeat runs: the plan made before launch (recorded in the
manifest) and the map the ranks reported once started (recorded in ``run.json``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any


def rank_plan(nproc: int, nnodes: int, node_rank: int, device: str) -> dict[str, dict[str, Any]]:
    """The rank -> host / GPU map the launch will make, known before any rank starts.

    Keyed by global rank (``node_rank * nproc + local_rank``, torchrun's static rendezvous and
    horovodrun alike); a rank on a CUDA device uses GPU ``local_rank % count`` as the workers
    choose it.  Hosts and GPU models are known only for this node's ranks (the capturing node);
    other nodes' are null.  What the ranks then reported is ``run.json``'s ``rank_maps``.
    """
    host = socket.gethostname()
    gpus: list[str] = []
    if device == "cuda":
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    plan = {}
    for node in range(nnodes):
        for local in range(nproc):
            here = node == node_rank
            index = local % len(gpus) if gpus else local
            plan[str(node * nproc + local)] = {
                "node_rank": node, "local_rank": local, "host": host if here else None,
                "device": f"cuda:{index}" if device == "cuda" else "cpu",
                "gpu": gpus[index] if gpus and here else None,
            }
    return plan


def rank_map(ranks: dict[str, Any], device: str) -> list[dict[str, Any]]:
    """Per rank of a ``repro500/ranks/v1`` document: host, local rank, device, GPU model and the
    ``NCCL_*`` / ``GLOO_*`` variables it ran with.  A CUDA rank uses GPU ``local_rank % count``, as
    the ddp worker chooses; the model is read from that host's hardware facet (NVML order)."""
    out = []
    for r in ranks.get("ranks") or []:
        entry: dict[str, Any] = {"rank": r.get("rank"), "host": r.get("host"), "local_rank": r.get("local_rank"),
                                 "device": "cpu", "gpu": None, "env": r.get("env") or {}}
        gpus = (r.get("hardware") or {}).get("gpus") or []
        if device == "cuda" and gpus and isinstance(r.get("local_rank"), int):
            index = r["local_rank"] % len(gpus)
            entry["device"] = f"cuda:{index}"
            entry["gpu"] = gpus[index].get("name")
        out.append(entry)
    return out


def record_rank_map(meta: dict[str, Any], ranks_file: Path, k: int, device: str) -> bool:
    """Put repeat *k*'s rank -> host / device map from its ``ranks.json`` into the run's ``meta``
    (run.json's ``distributed``, docs/distributed.md); False when the repeat wrote none or it
    cannot be read (a single-process repeat)."""
    if not ranks_file.is_file():
        return False
    try:
        ranks = json.loads(ranks_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    record = meta.setdefault("distributed", {})
    record["backend"] = ranks.get("backend")
    record.setdefault("rank_maps", {})[str(k)] = rank_map(ranks, device)
    return True
