"""How far repro500's own helpers step back from the experiment's CPU: the MLflow process a run
starts, and the runner's background threads beside a wrapped command.  Both run ``NICENESS``
nice levels below the run (capped at 19, the lowest), relative to the run's own level: a run that
``nice`` already lowered keeps its helpers below it, and none is ever raised above it."""

from __future__ import annotations

import os
from contextlib import suppress

NICENESS = 10  # of nice(1)'s 19 levels: helpers wait for a gap, the experiment's threads do not


def step_back(pid: int) -> None:
    """Put process or thread *pid* (a thread's native id) NICENESS levels below the caller's own
    level (Linux keeps one per thread); best effort: where priorities cannot be set, everything
    still runs, only sooner."""
    with suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, pid, min(os.getpriority(os.PRIO_PROCESS, 0) + NICENESS, 19))
