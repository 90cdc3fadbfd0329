"""Coverage of the variance decomposition's share intervals (``repro500 run --vary``).

Simulated factorial runs with known variance components: each cell of K repeats draws from a
normal with its source's variance; repro500.verify.variance.share_intervals gives each source's
90% generalised interval of its share, as ``verify`` does.  The share of the truth inside its
interval must be 0.90 within 3 Monte-Carlo standard errors on both sides (MISSED below, and exit
1): under-coverage means intervals that claim more than they know, over-coverage intervals wider
than they need be.

Run: ``python bench/variance_attribution.py`` (about 30 s).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from repro500.verify.variance import SHARE_CONFIDENCE, share_intervals  # noqa: E402

SIMULATIONS = 1000
PIVOTS = 4000  # per simulated run (verify uses 20 000; fewer here only widens the Monte-Carlo noise)
Z_LIMIT = 3.0
CASES = {
    "one dominant (1, 0.25, 0.04)": (1.0, 0.25, 0.04),
    "balanced (1, 1, 1)": (1.0, 1.0, 1.0),
    "two sources (1, 0.1)": (1.0, 0.1),
}


def coverage(variances, k, rng):
    truth = np.array(variances) / sum(variances)
    hits = np.zeros(len(variances))
    for i in range(SIMULATIONS):
        values = [rng.normal(0.0, math.sqrt(v), k) for v in variances]
        estimates = [float(np.var(x, ddof=1)) for x in values]
        intervals = share_intervals(estimates, [k] * len(variances), draws=PIVOTS, seed=i)
        hits += [low <= t <= high for t, (low, high) in zip(truth, intervals, strict=True)]
    return hits / SIMULATIONS


def main() -> int:
    start = time.perf_counter()
    rng = np.random.default_rng(20261124)
    se = math.sqrt(SHARE_CONFIDENCE * (1 - SHARE_CONFIDENCE) / SIMULATIONS)
    floor, ceiling = SHARE_CONFIDENCE - Z_LIMIT * se, SHARE_CONFIDENCE + Z_LIMIT * se
    print(f"share intervals at {SHARE_CONFIDENCE:.0%}: {SIMULATIONS} simulated runs per cell; MISSED when a "
          f"coverage is outside [{floor:.3f}, {ceiling:.3f}] (nominal +- 3 SE: too narrow or too wide)")
    missed = []
    for label, variances in CASES.items():
        for k in (3, 5, 10):
            cov = coverage(variances, k, rng)
            flags = ["under" if c < floor else "over" if c > ceiling else "" for c in cov]
            if any(flags):
                missed.append(f"{label} K={k} ({', '.join(f'{c:.3f} {f}' for c, f in zip(cov, flags, strict=True) if f)})")
            print(f"  {label:<30} K={k:>2}  coverage per source: {', '.join(f'{c:.3f}' for c in cov)}"
                  f"{'  MISSED (' + ', '.join(f for f in flags if f) + '-covers)' if any(flags) else ''}")
    print(f"elapsed {time.perf_counter() - start:.1f} s")
    print("RESULT: " + ("OK" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
