"""Timing one call many times: warm-up excluded, the median with its order-statistic interval.

Hoefler & Belli (SC'15) rules, as repro500 applies them to operators and inference:

* warm-up calls run first and are never timed (first calls allocate, pick kernels, fill caches);
  warm-up ends after ``warmup`` calls or ``warmup_s`` seconds, whichever comes later, or as soon
  as warming up has taken longer than the whole timing budget (a call that slow has warmed up);
* each timed call is measured alone, with the device synchronised before and after (CUDA is
  asynchronous: without the synchronisation a GPU kernel's launch is timed, not its run);
* timed calls repeat until ``max_reps`` or until ``budget_s`` is spent, but never fewer than
  ``min_reps`` (10 by default: the fewest that give the median a 95 % interval narrower than
  [min, max]) unless a call is so slow that ten budgets are spent first: then at least 3 calls
  (an emulated dtype on a CPU without it), and the interval's recorded confidence says so;
* the result is the median, with the exact distribution-free interval of the median
  (``repro500.verify.stats.median_interval``), because call times are skewed (interrupts, other
  processes on a shared machine) and the mean is pulled by the slow tail.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.statuses import DEFAULT_ALPHA

ALPHA = DEFAULT_ALPHA
SLOW_MIN_REPS = 3
SLOW_BUDGETS = 10


@dataclass(frozen=True)
class Budget:
    """How long and how often one case is timed."""

    warmup: int = 2
    warmup_s: float = 0.05
    min_reps: int = 10
    max_reps: int = 200
    budget_s: float = 1.0


@dataclass
class Timing:
    """Repeated timed calls of one case."""

    median_s: float
    ci_low_s: float | None
    ci_high_s: float | None
    ci_confidence: float | None
    calls: int
    warmup_calls: int
    times_s: list[float] = field(default_factory=list, repr=False)

    def as_dict(self, *, with_times: bool = False) -> dict[str, Any]:
        doc = asdict(self)
        if not with_times:
            doc.pop("times_s")
        return doc


def synchronizer(device: Any) -> Callable[[], None]:
    """A function that waits for ``device`` to finish its queued work (nothing on a CPU)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@contextlib.contextmanager
def math_mode(dtype: str) -> Iterator[dict[str, Any]]:
    """fp32 measured as IEEE fp32: TensorFloat-32 off for cuDNN and cuBLAS while the case runs.

    torch leaves cuDNN's TF32 on by default, so on Ampere and later GPUs an "fp32" convolution
    rounds its inputs to 10 mantissa bits: an H200 gave conv2d fp32 errors of 2.5e3-6.9e3 fp32
    epsilons, TF32's precision, not fp32's.  A figure called fp32 must be fp32's; the settings a
    training run used are recorded by capture (``cudnn_allow_tf32``).  Yields what was restored.
    """
    import torch

    if dtype != "fp32":
        yield {}
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = {"cudnn_allow_tf32": cudnn.allow_tf32, "cuda_matmul_allow_tf32": matmul.allow_tf32}
    cudnn.allow_tf32, matmul.allow_tf32 = False, False
    try:
        yield before
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = before["cudnn_allow_tf32"], before["cuda_matmul_allow_tf32"]


def summarize(times_s: list[float], warmup_calls: int = 0, alpha: float = ALPHA) -> Timing:
    """The median and its interval for already measured call times."""
    import statistics

    from repro500.verify.stats import median_interval

    ci = median_interval(times_s, alpha)
    return Timing(median_s=float(statistics.median(times_s)), ci_low_s=ci["low"], ci_high_s=ci["high"],
                  ci_confidence=ci["confidence"], calls=len(times_s), warmup_calls=warmup_calls,
                  times_s=list(times_s))


def time_calls(call: Callable[[], Any], sync: Callable[[], None], budget: Budget = Budget(),
               prepare: Callable[[], Any] | None = None) -> Timing:
    """Warm up, then time ``call()`` repeatedly.  ``prepare()`` (untimed) runs before each call: it
    restores state a call consumes (a gradient, an in-place output)."""
    warm, started = 0, time.perf_counter()
    while warm < budget.warmup or time.perf_counter() - started < budget.warmup_s:
        if prepare:
            prepare()
        call()
        sync()
        warm += 1
        if warm >= 100 * max(1, budget.warmup):  # a call too fast to fill warmup_s: enough of them
            break
        if time.perf_counter() - started > budget.budget_s:  # one call longer than the budget has warmed up
            break
    times: list[float] = []
    spent = 0.0
    while len(times) < budget.max_reps and (len(times) < budget.min_reps or spent < budget.budget_s):
        if len(times) >= SLOW_MIN_REPS and spent >= SLOW_BUDGETS * budget.budget_s:
            break
        if prepare:
            prepare()
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        elapsed = time.perf_counter() - t0
        times.append(elapsed)
        spent += elapsed
    return summarize(times, warm)
