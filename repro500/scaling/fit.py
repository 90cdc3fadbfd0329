"""Fit the alpha-beta model (latency L, seconds per byte gamma) to measured collectives.

Least squares on *relative* residuals, with L, gamma >= 0 (``scipy.optimize.nnls``).  Why
relative: the measured times span four orders of magnitude (tens of microseconds for 4 B,
tens of milliseconds for 64 MiB); ordinary least squares on seconds lets the largest
messages decide everything, and the latency it leaves can come out negative.  Dividing
each row by its measured time makes every message size count alike.  Exact timings are
recovered exactly.  R^2 is reported on the times themselves (seconds), as usual.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from repro500.errors import InvalidInput
from repro500.scaling.alphabeta import COLLECTIVES, CollectiveFit, coefficients


@dataclass(frozen=True)
class Point:
    """One measured collective: median time of *collective* with *message_bytes* on *p* ranks."""

    collective: str
    p: int
    message_bytes: int
    time_s: float

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Point:
        return cls(str(raw["collective"]), int(raw["p"]), int(raw["message_bytes"]), float(raw["time_s"]))

    def as_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "p": self.p, "message_bytes": self.message_bytes,
                "time_s": self.time_s}


def fit_collective(collective: str, points: Iterable[Point]) -> CollectiveFit:
    """L and gamma of one collective from its measured points (P > 1, time > 0)."""
    import numpy as np
    from scipy.optimize import nnls

    usable = [pt for pt in points if pt.collective == collective and pt.p > 1 and pt.time_s > 0]
    if len({(pt.p, pt.message_bytes) for pt in usable}) < 2:
        raise InvalidInput(
            f"the {collective} measurement has fewer than two (processes, bytes) points: "
            "remeasure with `repro500 model --remeasure`"
        )
    design = np.array([coefficients(collective, pt.message_bytes, pt.p) for pt in usable])
    times = np.array([pt.time_s for pt in usable])
    (latency_s, gamma), _ = nnls(design / times[:, None], np.ones(len(usable)))
    predicted = design @ np.array([latency_s, gamma])
    relative = (predicted - times) / times
    total = float(np.sum((times - times.mean()) ** 2))
    r2 = 1.0 - float(np.sum((times - predicted) ** 2)) / total if total > 0 else 1.0
    return CollectiveFit(
        collective=collective,
        latency_s=float(latency_s),
        gamma_s_per_byte=float(gamma),
        r2=r2,
        rms_rel_residual=float(math.sqrt(np.mean(relative**2))),
        max_rel_residual=float(np.max(np.abs(relative))),
        points=len(usable),
    )


def fit_all(points: Iterable[Point]) -> dict[str, CollectiveFit]:
    """A fit per collective (allreduce and allgather)."""
    points = list(points)
    return {name: fit_collective(name, points) for name in COLLECTIVES}


def residuals(fits: Mapping[str, CollectiveFit], points: Iterable[Point]) -> list[dict[str, Any]]:
    """Every measured point with the fit's prediction and the relative residual."""
    out = []
    for pt in points:
        if pt.collective not in fits or pt.p < 2:
            continue
        predicted = fits[pt.collective].time_s(pt.message_bytes, pt.p)
        out.append({**pt.as_dict(), "predicted_s": predicted,
                    "rel_residual": (predicted - pt.time_s) / pt.time_s if pt.time_s > 0 else None})
    return out
