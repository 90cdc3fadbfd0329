"""Which collectives a repeat's engine uses: the one place that picks them, so that the base
(:mod:`collectives`) never imports an implementation built on it (:mod:`averaging`)."""

from __future__ import annotations

from typing import Any

from repro500.workloads.engines.averaging import AveragingCollectives
from repro500.workloads.engines.collectives import Collectives, DdpCollectives, HorovodCollectives

ENGINES: dict[str, type[Collectives]] = {"local": Collectives, "ddp": DdpCollectives, "horovod": HorovodCollectives}


def for_engine(engine: str, world_size: int, sync: dict[str, Any] | None = None, rank: int = 0) -> Collectives:
    """The engine's collectives; with ``mutable.sync`` averaging parameters, the ddp engine's
    process group without DDP (engines/averaging.py)."""
    mode = (sync or {}).get("mode", "allreduce")
    if engine == "ddp" and world_size > 1 and mode != "allreduce":
        return AveragingCollectives(world_size, mode, int(sync.get("every", 1)), rank)
    return ENGINES[engine](world_size)
