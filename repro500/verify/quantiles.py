"""Distribution-free confidence intervals for any quantile, from order statistics.

The median's interval (``stats.median_interval``, Le Boudec; Hoefler & Belli SC'15) generalises
to any quantile q: with the values sorted, x_(l) <= xi_q < x_(u) holds exactly when at least l and
fewer than u of the n values lie below the true quantile xi_q, so its probability is
P(l <= B <= u - 1) with B ~ Binomial(n, q), whatever the distribution (continuous values).

The interval is equal-tailed: the largest l with P(B <= l - 1) <= alpha/2 and the smallest u with
P(B >= u) <= alpha/2.  A tail that no order statistic can reach (p99 of 100 values has no upper
bound at 95 %: even the maximum is below the true p99 with probability 0.99^100 = 37 %) is
``None`` with a note saying how many values would give one.  Latency quantiles (p50/p90/p99,
repro500.system.inference) use this; nothing here assumes a shape for the distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from repro500.statuses import DEFAULT_ALPHA
from repro500.verify import distributions as dist


def point(values: Sequence[float], q: float) -> float | None:
    """The sample quantile: the order statistic of rank ceil(n q) (Hyndman & Fan type 1, no
    interpolation: a latency reported is one that was measured)."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0:
        return None
    rank = min(x.size, max(1, math.ceil(x.size * q)))
    return float(x[rank - 1])


def needed(q: float, alpha: float) -> int:
    """The fewest values for which both ends of the (1 - alpha) interval of the q-quantile exist."""
    tail = alpha / 2.0
    # the upper end needs q^n <= tail, the lower (1 - q)^n <= tail
    return int(math.ceil(max(math.log(tail) / math.log(q), math.log(tail) / math.log(1.0 - q))))


def interval(values: Sequence[float], q: float, alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """The (1 - alpha) order-statistic interval of the q-quantile of ``values``.

    Returns ``{"q", "n", "value", "low", "high", "confidence", "ranks", "note"}``; ``confidence``
    is the exact coverage P(l <= B <= u - 1) of the ranks chosen (>= 1 - alpha when both exist).
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q!r} is outside (0, 1)")
    x = np.sort(np.asarray(values, dtype=float))
    n = int(x.size)
    out: dict[str, Any] = {"q": q, "n": n, "value": point(x, q), "low": None, "high": None,
                           "confidence": None, "ranks": None, "note": None}
    if n < 2:
        out["note"] = "fewer than two values: no interval"
        return out
    tail = alpha / 2.0
    ks = np.arange(n + 1)
    cdf = dist.binom_cdf(ks, n, q)  # cdf[k] = P(B <= k)
    sf = dist.binom_sf(ks - 1, n, q)  # sf[k] = P(B >= k)
    lows = [rank for rank in range(1, n + 1) if cdf[rank - 1] <= tail]
    highs = [rank for rank in range(1, n + 1) if sf[rank] <= tail]
    low_rank = max(lows) if lows else None
    high_rank = min(highs) if highs else None
    if low_rank is not None:
        out["low"] = float(x[low_rank - 1])
    if high_rank is not None:
        out["high"] = float(x[high_rank - 1])
    out["ranks"] = [low_rank, high_rank]
    below = float(cdf[low_rank - 1]) if low_rank is not None else 0.0
    above = float(sf[high_rank]) if high_rank is not None else 0.0
    out["confidence"] = 1.0 - below - above if low_rank and high_rank else None
    if low_rank is None or high_rank is None:
        side = "lower" if low_rank is None else "upper"
        out["note"] = (f"{n} values give no {side} bound for the {q:g} quantile at {1 - alpha:.0%}; "
                       f"{needed(q, alpha)} values would")
    return out
