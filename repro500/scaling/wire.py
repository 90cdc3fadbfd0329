"""Bytes on the wire per step, from repro500.ext's own accounting (docs/compression.md).

DDP hands a compressor one gradient *bucket* at a time, so the wire cost is per bucket:
the compressor's payload for a bucket of n elements (m bytes), then the ring model of the
collective it uses (allreduce for summable payloads, allgather for the others).  Nothing is
re-derived here: the payload is what :meth:`repro500.ext.communicator.Communicator.prepare`
hands to the collective, computed on a "meta" tensor (shapes only, no data, no compiled
operators), and the bytes per rank are :func:`~repro500.ext.communicator.allreduce_bytes` and
:func:`~repro500.ext.communicator.allgather_bytes`.

The bucket layout follows DDP's defaults: the first bucket (the last layers) holds about
1 MiB, every other one about 25 MiB.  DDP closes a bucket at the first whole tensor that
crosses the cap; from a parameter count alone the layer sizes are unknown, so the buckets
here are cut at exactly the caps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from repro500.errors import UsageError
from repro500.ext import specs

MiB = 1 << 20
FIRST_BUCKET_BYTES = 1 * MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = 25 * MiB  # DistributedDataParallel's bucket_cap_mb default
GRADIENT_BYTES_PER_ELEMENT = 4  # float32 gradients


@dataclass(frozen=True)
class Bucket:
    """*count* DDP buckets of *numel* gradient elements, each sending *payload_bytes*."""

    numel: int
    count: int
    payload_bytes: int  # what one rank hands to the collective for one such bucket

    def as_dict(self) -> dict[str, int]:
        return {"numel": self.numel, "count": self.count, "payload_bytes": self.payload_bytes}


def bucket_plan(params: int, element_bytes: int = GRADIENT_BYTES_PER_ELEMENT) -> list[tuple[int, int]]:
    """(numel, count) of DDP's buckets for *params* gradient elements: 1 MiB first, then 25 MiB."""
    if params < 1:
        raise UsageError(f"the model must have at least one parameter, got {params}")
    first = FIRST_BUCKET_BYTES // element_bytes
    full = BUCKET_BYTES // element_bytes
    if params <= first:
        return [(params, 1)]
    plan = [(first, 1)]
    rest = params - first
    if rest // full:
        plan.append((full, rest // full))
    if rest % full:
        plan.append((rest % full, 1))
    return plan


def _for_sizing(spec: str | Mapping[str, Any] | None) -> str | Mapping[str, Any] | None:
    """A spec as run.json records it has ``seed: null`` when each repeat drew its own seed
    (ext/specs.py); a payload's size does not depend on the seed, so it is sized with the default."""
    if isinstance(spec, Mapping) and "seed" in spec and spec["seed"] is None:
        return {k: v for k, v in spec.items() if k != "seed"}
    return spec


def compressor_spec(spec: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The canonical spec of a compressor (UsageError, exit 2, for an unknown one or a bad value)."""
    from repro500.ext import compressors

    return compressors.get(_for_sizing(spec)).spec()


def is_summable(spec: str | Mapping[str, Any] | None) -> bool:
    """Whether the compressor's payloads are allreduced (True) or allgathered (False)."""
    from repro500.ext import compressors

    return bool(compressors.get(_for_sizing(spec)).summable)


def payload_bytes(spec: str | Mapping[str, Any] | None, numel: int) -> int:
    """Bytes one rank hands to the collective for a float32 bucket of *numel* elements."""
    import torch

    from repro500.ext import compressors, memory, ops
    from repro500.ext.communicator import Communicator

    compressor = compressors.get(_for_sizing(spec))
    if isinstance(compressor, compressors.PowerSGDCompressor):
        raise UsageError(
            "powersgd's wire size depends on every layer's shape, not on the parameter count: "
            "give a RUN_DIR of a run that used powersgd (its measured bytes are used)"
        )
    comm = Communicator(compressor, memory.for_compressor(compressor), world_size=1, rank=0)
    # The reference operators never compile anything; on "meta" they compute shapes only.
    with ops.use_backend("reference"):
        try:
            out = comm.prepare(torch.empty(numel, dtype=torch.float32, device="meta"), "bucket")
        except (RuntimeError, NotImplementedError):
            # Data-dependent steps (TernGrad's clipping reads the std) need real values;
            # the payload's size does not depend on them.
            out = comm.prepare(torch.zeros(numel, dtype=torch.float32), "bucket")
    return out.buffer.numel() * out.buffer.element_size()


def powersgd_payload_bytes(spec: str | Mapping[str, Any] | None, shapes: list[tuple[int, ...]],
                           element_bytes: int = GRADIENT_BYTES_PER_ELEMENT) -> int:
    """Bytes one rank hands to torch's powerSGD_hook allreduces for one bucket whose gradients have
    *shapes*, once it compresses (after ``start_iter``; before, the whole bucket): each gradient is an
    n x m matrix (n = its first dimension), sent as P (n x r) and Q (m x r) when
    ``(n + m)·r · min_compression_rate < n·m`` with r = min(n, m, rank), else as itself
    (torch's ``_should_compress``).  The layer shapes are needed: the parameter count alone
    does not say it, which is why ``repro500 model`` takes powersgd's bytes from a run."""
    resolved = specs.resolve(spec, seed_per_repeat=True)  # a run.json spec: the seed does not size P and Q
    if resolved["name"] != "powersgd":
        raise UsageError(f"powersgd_payload_bytes is for powersgd, not {resolved['name']}")
    numel = 0
    for shape in shapes:
        size = 1
        for dim in shape:
            size *= int(dim)
        n = int(shape[0]) if shape else 1
        m = size // n if n else 0
        r = min(n, m, resolved["rank"])
        compressed = (n + m) * r
        numel += compressed if compressed * resolved["min_compression_rate"] < n * m else size
    return numel * element_bytes


def buckets(spec: str | Mapping[str, Any] | None, params: int) -> list[Bucket]:
    """DDP's buckets for *params* float32 gradient elements with their compressed payloads."""
    return [Bucket(numel, count, payload_bytes(spec, numel)) for numel, count in bucket_plan(params)]


def scaled_buckets(params: int, total_payload_bytes: int) -> list[Bucket]:
    """Buckets whose payloads share a measured per-step total in proportion to their size."""
    out = []
    for numel, count in bucket_plan(params):
        out.append(Bucket(numel, count, max(1, round(total_payload_bytes * numel / params))))
    return out


def bytes_per_rank(buckets_: list[Bucket], p: int, summable: bool) -> int:
    """Bytes one rank sends (= receives) per step on *p* processes, by ext's ring model."""
    from repro500.ext.communicator import allgather_bytes, allreduce_bytes

    per_bucket = allreduce_bytes if summable else allgather_bytes
    return sum(b.count * per_bucket(b.payload_bytes, p) for b in buckets_)


def dense_params_from_bytes(dense_bytes_sent: float, p: int,
                            element_bytes: int = GRADIENT_BYTES_PER_ELEMENT) -> int:
    """Gradient elements behind a recorded ``dense_bytes_sent`` (a ring allreduce on p ranks)."""
    if p < 2:
        raise ValueError("a single process sends nothing")
    return round(dense_bytes_sent * p / (2 * (p - 1)) / element_bytes)


def payload_from_bytes_sent(bytes_sent: float, p: int, summable: bool) -> int:
    """Per-step payload bytes behind a recorded ``bytes_sent`` on p ranks (inverse ring model)."""
    if p < 2:
        raise ValueError("a single process sends nothing")
    return round(bytes_sent * p / (2 * (p - 1)) if summable else bytes_sent / (p - 1))
