"""Time Gloo allreduce and allgather on this machine, and cache the result.

P processes (``torch.multiprocessing.spawn``) join a Gloo group on 127.0.0.1 and run each
collective on float32 messages from 4 B to ``max_bytes`` (a factor 4 apart): ``warmup``
untimed calls, then ``reps`` timed ones, each after a barrier (more for cheap messages: as
many as fit in ``budget_s``, up to 50, because a shared machine's noise hits short calls
hardest).  A repetition's time is the slowest rank's (the collective is done when every rank
is), the point's time the median over repetitions.  Each process uses one thread, as a DDP
rank on a shared CPU would.

The measurement is cached in ``repro500.capture.cache.cache_dir("scaling")``, one file per host and
torch version (the two things that change the numbers without changing the code); a cached
file measured with other settings, or unreadable, is measured again.  ``remeasure=True``
always measures.
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from repro500.capture.cache import cache_dir
from repro500.capture.hardware import usable_cpus
from repro500.errors import UsageError
from repro500.rundir import atomic
from repro500.scaling import group
from repro500.scaling.alphabeta import COLLECTIVES
from repro500.scaling.fit import Point

SCHEMA = "repro500/collectives/v1"
MiB = 1 << 20
MAX_REPS = 50


@dataclass(frozen=True)
class Settings:
    """What is measured: process counts, message sizes and repetitions."""

    p_values: tuple[int, ...] = (2,)
    min_bytes: int = 4
    max_bytes: int = 64 * MiB
    factor: int = 4
    reps: int = 5  # at least; cheap messages get more, up to MAX_REPS within budget_s
    warmup: int = 2
    budget_s: float = 0.2  # time per point that decides the extra repetitions

    def sizes_bytes(self) -> list[int]:
        """Log-spaced message sizes: min_bytes, min_bytes*factor, ... up to max_bytes."""
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= self.factor
        return sizes

    def check(self) -> None:
        if not self.p_values or any(p < 2 for p in self.p_values):
            raise UsageError(f"measured process counts {list(self.p_values)} must all be >= 2 "
                             "(one process does not communicate)")
        if self.min_bytes < 4 or self.min_bytes % 4:
            raise UsageError(f"the smallest message ({self.min_bytes} B) must be a multiple of 4 B (float32)")
        if self.max_bytes < self.min_bytes * self.factor:
            raise UsageError(f"the largest message ({self.max_bytes} B) must be at least "
                             f"{self.min_bytes * self.factor} B so that two sizes are measured")
        if self.factor < 2 or self.reps < 1 or self.warmup < 1 or self.budget_s < 0:
            raise UsageError("measurement needs factor >= 2, reps >= 1, warmup >= 1 and budget_s >= 0")


def settings_given(p_values: tuple[int, ...] | None = None, max_bytes: int | None = None,
                   reps: int | None = None) -> Settings | None:
    """The default settings with whichever of these are given, checked; None when none is given
    (then :func:`measured` accepts whatever the cache holds)."""
    given = {k: v for k, v in (("p_values", p_values), ("max_bytes", max_bytes), ("reps", reps)) if v is not None}
    if not given:
        return None
    settings = replace(Settings(), **given)
    settings.check()
    return settings


@dataclass
class Measurement:
    """Measured collective times on one host with one torch version."""

    host: str
    torch_version: str
    measured_utc: str
    settings: Settings
    points: list[Point] = field(default_factory=list)
    wall_time_s: float = 0.0
    cached: bool = False  # True when read from the cache rather than measured now

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "host": self.host, "torch_version": self.torch_version,
                "measured_utc": self.measured_utc, "settings": asdict(self.settings),
                "wall_time_s": self.wall_time_s, "points": [pt.as_dict() for pt in self.points]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Measurement:
        if raw.get("schema") != SCHEMA:
            raise ValueError(f"schema {raw.get('schema')!r}")
        settings = dict(raw["settings"])
        settings["p_values"] = tuple(settings["p_values"])
        return cls(host=str(raw["host"]), torch_version=str(raw["torch_version"]),
                   measured_utc=str(raw["measured_utc"]), settings=Settings(**settings),
                   points=[Point.from_dict(p) for p in raw["points"]],
                   wall_time_s=float(raw.get("wall_time_s", 0.0)), cached=True)


def host_key() -> tuple[str, str]:
    """(host name, torch version) without importing torch."""
    return socket.gethostname(), metadata.version("torch")


def cache_path() -> Path:
    host, torch_version = host_key()
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{host}-torch{torch_version}")
    return cache_dir("scaling") / f"collectives-{safe}.json"


def _points(rank: int, world_size: int, device: Any, settings: Settings) -> list[dict[str, Any]]:
    """One rank's part of the measurement: every collective at every size (group.run calls it)."""
    import torch
    import torch.distributed as dist

    # torch 2.14 renamed all_gather_into_tensor (now deprecated) to all_gather_single.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    results = []
    for collective in COLLECTIVES:
        for nbytes in settings.sizes_bytes():
            send = torch.ones(nbytes // 4, dtype=torch.float32)
            recv = torch.empty(send.numel() * world_size, dtype=torch.float32)
            call = (lambda send=send: dist.all_reduce(send)) if collective == "allreduce" else \
                (lambda send=send, recv=recv: all_gather(recv, send))
            times = group.slowest_times(lambda call=call: group.timed(call), warmup=settings.warmup,
                                        min_reps=settings.reps, max_reps=max(MAX_REPS, settings.reps),
                                        budget_s=settings.budget_s)
            results.append(Point(collective, world_size, nbytes, statistics.median(times)).as_dict())
    return results


def measure(settings: Settings | None = None) -> Measurement:
    """Time the collectives now (no cache); takes seconds to a minute."""
    settings = settings or Settings()
    settings.check()
    cores = usable_cpus()
    if max(settings.p_values) > cores:
        print(f"repro500: warning: measuring {max(settings.p_values)} processes on {cores} CPU cores "
              "oversubscribes the machine; the fitted latency will be pessimistic", file=sys.stderr)
    host, torch_version = host_key()
    started = time.perf_counter()
    points: list[Point] = []
    for p in settings.p_values:
        points.extend(Point.from_dict(r) for r in group.run(_points, p, (settings,), what="Gloo collectives"))
    return Measurement(host=host, torch_version=torch_version,
                       measured_utc=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       settings=settings, points=points, wall_time_s=time.perf_counter() - started)


def read_cached(settings: Settings | None = None) -> Measurement | None:
    """The cached measurement for this host and torch version, if readable and made with *settings*."""
    path = cache_path()
    try:
        cached = Measurement.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"repro500: ignoring the unreadable collective timings in {path} ({type(err).__name__}); "
              "measuring again", file=sys.stderr)
        return None
    if settings is not None and cached.settings != settings:
        return None
    return cached


def write_cache(measurement: Measurement) -> Path:
    path = cache_path()
    atomic.write_json(path, measurement.as_dict())
    return path


def measured(settings: Settings | None = None, *, remeasure: bool = False, quiet: bool = False) -> Measurement:
    """The collective timings for this machine: from the cache, else measured now and cached.

    *settings* None accepts whatever the cache holds (measuring with the defaults if nothing).
    """
    if not remeasure:
        cached = read_cached(settings)
        if cached is not None:
            return cached
    settings = settings or Settings()
    if not quiet:
        sizes = settings.sizes_bytes()
        print(f"repro500: timing Gloo allreduce/allgather on {', '.join(map(str, settings.p_values))} "
              f"processes, {sizes[0]} B to {sizes[-1]} B ({len(sizes)} sizes, {settings.reps} reps; "
              "about a minute, cached afterwards)...", file=sys.stderr)
    result = measure(settings)
    write_cache(result)
    return result
