"""The alpha-beta cost model of the two collectives data-parallel training uses.

Ben-Nun & Hoefler (2019), with L the latency of one message (seconds) and gamma the
transfer time per byte (seconds/byte), for m bytes per process and P processes:

    allreduce:  T = 2 L log2 P + 2 gamma m (P-1)/P     (reduce-scatter + allgather)
    allgather:  T =   L log2 P +   gamma m (P-1)       (each rank receives (P-1) m bytes)

Both are linear in (L, gamma): T = a_L * L + a_gamma * m-term, which is what the fit solves
and what the prediction evaluates.  One process communicates nothing: T = 0 at P = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

COLLECTIVES = ("allreduce", "allgather")

FORMULAS = {
    "allreduce": "T = 2 L log2 P + 2 gamma m (P-1)/P",
    "allgather": "T = L log2 P + gamma m (P-1)",
}


def coefficients(collective: str, message_bytes: float, p: int) -> tuple[float, float]:
    """(a_L, a_gamma) such that T = a_L * L + a_gamma * gamma for this collective, m and P."""
    if p < 1:
        raise ValueError(f"process count must be >= 1, got {p}")
    log_p = math.log2(p)
    if collective == "allreduce":
        return 2.0 * log_p, 2.0 * message_bytes * (p - 1) / p
    if collective == "allgather":
        return log_p, message_bytes * (p - 1)
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class CollectiveFit:
    """A fitted collective: latency, seconds per byte, and how well the fit describes the data."""

    collective: str
    latency_s: float  # L
    gamma_s_per_byte: float  # gamma; 1/gamma is the effective bandwidth
    r2: float  # coefficient of determination on the measured times (seconds)
    rms_rel_residual: float  # root mean square of (predicted - measured) / measured
    max_rel_residual: float  # largest |predicted - measured| / measured
    points: int  # measured (P, m) points used

    def time_s(self, message_bytes: float, p: int) -> float:
        """Predicted time of one collective of *message_bytes* per process on *p* processes."""
        a_latency, a_gamma = coefficients(self.collective, message_bytes, p)
        return a_latency * self.latency_s + a_gamma * self.gamma_s_per_byte

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return 1.0 / self.gamma_s_per_byte if self.gamma_s_per_byte > 0 else None

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "collective": self.collective,
            "formula": FORMULAS[self.collective],
            "latency_s": self.latency_s,
            "gamma_s_per_byte": self.gamma_s_per_byte,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "r2": self.r2,
            "rms_rel_residual": self.rms_rel_residual,
            "max_rel_residual": self.max_rel_residual,
            "points": self.points,
        }
