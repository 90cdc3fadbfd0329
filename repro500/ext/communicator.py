"""The Communicator: error feedback + compression + the collective, and what it cost.

It is split in two halves around the collective so that any backend can sit in between
(torch.distributed futures in :mod:`repro500.ext.ddp_hook`, Horovod handles in
:mod:`repro500.ext.horovod`):

    out = communicator.prepare(tensor, name)      # compensate, compress, update memory
    # summable payload  -> allreduce(out.buffer) (SUM), then communicator.finish_allreduce
    # otherwise         -> allgather(out.buffer) (one uint8 buffer per rank), then
    #                      communicator.finish_allgather
    averaged = communicator.finish_...(...)      # decompress, average over ranks, restore

Byte accounting (docs/compression.md, "Bytes on the wire"): the bytes each rank sends and
receives are those of the standard ring algorithms on the payload actually handed to the
collective, m bytes per rank and P ranks:

    allreduce (ring reduce-scatter + allgather):  sent = received = 2·(P−1)/P · m
    allgather (ring):                             sent = received = (P−1) · m

``compression_ratio`` = dense_bytes_sent / bytes_sent, where the dense baseline is a ring
allreduce of the uncompressed tensor (in its own dtype) under the same model, so the ratio
compares like with like.  ``time_compress_s`` covers error feedback plus compression (the
memory update decompresses the rank's own payload), ``time_decompress_s`` the decoding and
averaging of what arrived, ``time_comm_s`` the collective from launch to completion.
``compressed`` is false for a step whose buckets went as plain allreduces of the uncompressed
gradient because the compressor was not active yet (PowerSGD before ``start_iter``): its bytes
are dense bytes, and its ratio 1.0 says nothing about the compressor.

These byte counts are a model, not a measurement: each rank computes them from its own
payload, the trainer records rank 0's, and the ring formulas assume every rank hands the
collective the same number of bytes (true for every compressor here).  ``bench/wire_bytes.py``
checks them against the kernel's TCP counters.  ``time_comm_s`` overlaps the backward pass
(DDP launches a bucket as soon as its gradients are ready), so it is not the time a step
spends on communication; :meth:`Communicator.comm_wait_s` is: from the last launch (the
rank's own backward work done) until the caller's mark (the end of the backward pass), plus
any time a hook blocked the backward pass on a collective (:meth:`Communicator.record_blocked`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from repro500.ext.compressors import Compressor, Ctx
from repro500.ext.memory import NoneMemory


def allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends (= receives) in a ring allreduce of *nbytes* per rank."""
    return (2 * (world_size - 1) * nbytes) // world_size if world_size > 1 else 0


def allgather_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends (= receives) in a ring allgather of *nbytes* per rank."""
    return (world_size - 1) * nbytes if world_size > 1 else 0


@dataclass
class StepStats:
    """Communication cost accumulated over the buckets (tensors) of one optimizer step."""

    bytes_sent: int = 0
    bytes_received: int = 0
    dense_bytes_sent: int = 0  # what a plain allreduce of the same tensors would send
    time_compress_s: float = 0.0
    time_decompress_s: float = 0.0
    time_comm_s: float = 0.0
    tensors: int = 0
    dense_tensors: int = 0  # buckets sent uncompressed: the compressor was not active yet
    bucket_numels: list[int] = field(default_factory=list)  # each tensor's gradient elements, in hook order


    def as_dict(self) -> dict[str, Any]:
        """The record the trainer writes into metrics.jsonl (units in the names)."""
        ratio = self.dense_bytes_sent / self.bytes_sent if self.bytes_sent else None
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "dense_bytes_sent": self.dense_bytes_sent,
            "compression_ratio": ratio,
            "time_compress_s": self.time_compress_s,
            "time_decompress_s": self.time_decompress_s,
            "time_comm_s": self.time_comm_s,
            "tensors": self.tensors,
            # DDP's cut of the gradients this step (the wire model's input: scaling/wire.py)
            "bucket_numels": list(self.bucket_numels),
            # None when nothing was exchanged; False when any bucket skipped the compressor
            "compressed": (self.dense_tensors == 0) if self.tensors else None,
        }


@dataclass
class Outgoing:
    """One tensor on its way out: what goes into the collective and what stays here."""

    name: object
    buffer: torch.Tensor  # the one tensor handed to the collective
    ctx: Ctx
    summable: bool
    templates: list[tuple[torch.dtype, torch.Size]] = field(default_factory=list)


_ALIGN_BYTES = 8  # each packed payload tensor starts 8-byte aligned so it can be viewed in place


def pack(payload: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[torch.dtype, torch.Size]]]:
    """Concatenate payload tensors into one uint8 buffer (one collective instead of several)."""
    parts, templates = [], []
    for tensor in payload:
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)
        pad = -raw.numel() % _ALIGN_BYTES
        parts.append(raw)
        if pad:
            parts.append(raw.new_zeros(pad))
        templates.append((tensor.dtype, tensor.shape))
    return torch.cat(parts), templates


def unpack(
    buffer: torch.Tensor, templates: list[tuple[torch.dtype, torch.Size]]
) -> list[torch.Tensor]:
    """Split a buffer made by :func:`pack` (on any rank: all ranks' payloads share shapes)."""
    out, offset = [], 0
    for dtype, shape in templates:
        nbytes = shape.numel() * torch.empty((), dtype=dtype).element_size()
        out.append(buffer[offset : offset + nbytes].view(dtype).view(shape))
        offset += nbytes + (-nbytes % _ALIGN_BYTES)
    return out


class Communicator:
    """Compressor + memory for one rank, with per-step cost accounting (thread-safe)."""

    def __init__(
        self, compressor: Compressor, memory: NoneMemory, world_size: int, rank: int
    ) -> None:
        self.compressor = compressor
        self.memory = memory
        self.world_size = world_size
        self.rank = rank
        compressor.bind(rank, world_size)
        self._stats = StepStats()
        self._lock = threading.Lock()  # collective callbacks may run on a backend thread
        self._last_launch: float | None = None  # perf_counter() when the last payload left
        self._blocked_s = 0.0  # seconds a hook held the backward pass waiting on a collective

    def mark_launched(self) -> None:
        """Note that a payload was just handed to its collective (see :meth:`comm_wait_s`)."""
        self._last_launch = time.perf_counter()

    def comm_wait_s(self, until: float) -> float | None:
        """Seconds from the last launch to *until* (a ``time.perf_counter()`` value): the part of
        the communication the rank waited for rather than hid behind its backward pass; None
        when nothing was launched since the last :meth:`step_stats` reset.  Time recorded with
        :meth:`record_blocked` is added: the backward pass waited for it too."""
        if self._last_launch is None:
            return None
        return self._blocked_s + max(0.0, until - self._last_launch)

    def record_blocked(self, seconds: float) -> None:
        """A hook waited *seconds* for its collectives before returning to the backward pass."""
        with self._lock:
            self._blocked_s += seconds

    def _add(self, **amounts: float) -> None:
        with self._lock:
            for key, value in amounts.items():
                setattr(self._stats, key, getattr(self._stats, key) + value)

    def record_comm_time(self, seconds: float) -> None:
        self._add(time_comm_s=seconds)

    def record_bytes(self, sent: int, received: int, dense_sent: int, compressed: bool = True,
                     numel: int | None = None) -> None:
        """One bucket's bytes; *compressed* False: it went uncompressed (compressor not active yet);
        *numel*: its gradient elements."""
        self._add(bytes_sent=sent, bytes_received=received, dense_bytes_sent=dense_sent, tensors=1,
                  dense_tensors=0 if compressed else 1)
        if numel is not None:
            with self._lock:
                self._stats.bucket_numels.append(int(numel))

    def step_stats(self, reset: bool = True) -> dict[str, Any]:
        """Costs accumulated since the last reset (one optimizer step when called per step)."""
        with self._lock:
            stats = self._stats.as_dict()
            if reset:
                self._stats = StepStats()
                self._last_launch = None
                self._blocked_s = 0.0
        return stats

    def prepare(self, tensor: torch.Tensor, name: object) -> Outgoing:
        """Error feedback and compression; returns the buffer for the collective."""
        start = time.perf_counter()
        compensated = self.memory.compensate(tensor, name)
        payload, ctx = self.compressor.compress(compensated, name)
        self.memory.update(compensated, name, self.compressor, payload, ctx)
        if self.compressor.summable:
            if len(payload) != 1 or not payload[0].is_floating_point():
                raise TypeError(
                    f"summable compressor {self.compressor.name} must return one floating tensor"
                )
            # Divide before the sum (as torch's allreduce_hook) so fp16 sums do not overflow.
            out = Outgoing(name, payload[0].div(self.world_size), ctx, True)
            nbytes = out.buffer.numel() * out.buffer.element_size()
            moved = allreduce_bytes(nbytes, self.world_size)
        else:
            buffer, templates = pack(payload)
            out = Outgoing(name, buffer, ctx, False, templates)
            moved = allgather_bytes(buffer.numel(), self.world_size)
        dense = allreduce_bytes(tensor.numel() * tensor.element_size(), self.world_size)
        self._add(time_compress_s=time.perf_counter() - start)
        self.record_bytes(moved, moved, dense, numel=tensor.numel())
        return out

    def finish_allreduce(self, out: Outgoing, reduced: torch.Tensor) -> torch.Tensor:
        """Average from the SUM of all ranks' (pre-divided) payloads."""
        start = time.perf_counter()
        result = self.memory.restore(self.compressor.decompress([reduced], out.ctx))
        self._add(time_decompress_s=time.perf_counter() - start)
        return result

    def finish_allgather(self, out: Outgoing, gathered: torch.Tensor) -> torch.Tensor:
        """Average from the concatenation of every rank's packed buffer (rank order)."""
        start = time.perf_counter()
        per_rank = gathered.view(self.world_size, -1)
        payloads = [unpack(per_rank[r], out.templates) for r in range(self.world_size)]
        total = self.compressor.aggregate(payloads, out.ctx)
        result = self.memory.restore(total / self.world_size)
        self._add(time_decompress_s=time.perf_counter() - start)
        return result

    def exchange_local(self, tensor: torch.Tensor, name: object) -> torch.Tensor:
        """The whole round trip with world size 1 (no collective): for tests and single runs."""
        if self.world_size != 1:
            raise ValueError("exchange_local is for world size 1")
        out = self.prepare(tensor, name)
        if out.summable:
            return self.finish_allreduce(out, out.buffer)
        return self.finish_allgather(out, out.buffer)
