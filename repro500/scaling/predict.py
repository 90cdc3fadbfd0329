"""Predict step time, communication time and parallel efficiency at P processes.

Weak scaling (every process keeps its batch, so its compute time per step is constant):

    comm(P)  = sum over buckets b of  T_collective(m_b, P)          (alphabeta.py)
    step(P)  = data + compute + compress + decompress(P) + comm(P) - hidden(P)
    hidden   = min(overlap * comm(P), compute)                      (0 by default)
    E(P)     = step(1) / step(P),   step(1) = data + compute        (nothing to exchange)

With ``overlap`` 0 nothing is hidden behind computation, so the prediction is an upper
bound on the step time (and a lower bound on the efficiency).  Decompression of allgathered
payloads decodes one payload per process, so its measured time scales with P / P_measured;
allreduced payloads are decoded once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from repro500.errors import UsageError
from repro500.scaling import wire
from repro500.scaling.alphabeta import CollectiveFit

DEFAULT_P = tuple(2**k for k in range(3, 11))  # 8, 16, ..., 1024


@dataclass(frozen=True)
class Workload:
    """One rank's step: its computation and what it exchanges."""

    params: int
    buckets: list[wire.Bucket]
    summable: bool  # allreduce (True) or allgather (False)
    compute_time_s: float  # forward + backward + optimizer, no communication
    data_time_s: float = 0.0
    compress_time_s: float = 0.0  # per step, all buckets
    decompress_time_s: float = 0.0  # per step, measured on decompress_p processes
    decompress_p: int = 2
    every: int = 1  # the collectives run every this many steps (local SGD); costs are per step

    @property
    def collective(self) -> str:
        return "allreduce" if self.summable else "allgather"


@dataclass(frozen=True)
class Prediction:
    p: int
    step_time_s: float
    comm_time_s: float
    compression_time_s: float  # compress + decompress
    efficiency: float
    bytes_per_rank: int  # sent (= received) per step by each rank

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def parse_p_list(text: str) -> list[int]:
    """"8,16,32" -> [8, 16, 32] (UsageError for anything but positive integers)."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise UsageError(f"process count {item!r} in {text!r} is not a positive integer; use e.g. 8,16,32")
        values.append(int(item))
    if not values:
        raise UsageError(f"{text!r} names no process counts; use e.g. 8,16,32")
    return sorted(set(values))


def comm_time_s(workload: Workload, fit: CollectiveFit, p: int) -> float:
    """Seconds per step spent in collectives on *p* processes (one per bucket, not overlapped)."""
    if p < 2:
        return 0.0
    return sum(b.count * fit.time_s(b.payload_bytes, p) for b in workload.buckets) / workload.every


def compression_time_s(workload: Workload, p: int) -> float:
    if p < 2:
        return 0.0
    decompress = workload.decompress_time_s
    if not workload.summable:
        decompress *= p / workload.decompress_p
    return workload.compress_time_s + decompress


def predict_one(workload: Workload, fits: Mapping[str, CollectiveFit], p: int, overlap: float = 0.0) -> Prediction:
    if not 0.0 <= overlap <= 1.0:
        raise UsageError(f"overlap {overlap} is not a fraction; use a value from 0 (none) to 1 (all hidden)")
    fit = fits[workload.collective]
    comm = comm_time_s(workload, fit, p)
    compression = compression_time_s(workload, p)
    hidden = min(overlap * comm, workload.compute_time_s)
    base = workload.data_time_s + workload.compute_time_s
    step = base + compression + comm - hidden
    return Prediction(p=p, step_time_s=step, comm_time_s=comm, compression_time_s=compression,
                      efficiency=base / step if step > 0 else 1.0,
                      bytes_per_rank=wire.bytes_per_rank(workload.buckets, p, workload.summable) // workload.every)


def predict(workload: Workload, fits: Mapping[str, CollectiveFit], p_values: Iterable[int] = DEFAULT_P,
            overlap: float = 0.0) -> list[Prediction]:
    """Predictions at every process count in *p_values*, in increasing order."""
    return [predict_one(workload, fits, p, overlap) for p in sorted(set(p_values))]
