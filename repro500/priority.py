"""How far repro500's own helpers step back from the experiment's CPU: the MLflow process a run
starts, and the runner's background threads beside a wrapped command.  Both run ``niceness()``
nice levels below the run (capped at 19, the lowest), relative to the run's own level: a run that
``nice`` already lowered keeps its helpers below it, and none is ever raised above it.

``REPRO500_HELPER_NICENESS`` sets the step (0 to 19, default 10).  On a machine whose cores are
all busy with other work at the run's own level (several runs or test workers at once, repeats
side by side on every core), a helper 10 levels down gets about a tenth of a core: MLflow's
process then takes minutes to import, and the run waits for it at its end.  0 keeps the helpers
level with the run there."""

from __future__ import annotations

import os
from contextlib import suppress

from repro500.errors import InvalidInput
from repro500.untrusted import plain

ENV = "REPRO500_HELPER_NICENESS"
NICENESS = 10  # of nice(1)'s 19 levels by default: helpers wait for a gap, the experiment's threads do not


def niceness() -> int:
    """The levels helpers step back: ``REPRO500_HELPER_NICENESS``, else :data:`NICENESS`;
    InvalidInput for anything but a whole number from 0 to 19 (checked before a run writes)."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return NICENESS
    value = int(text) if text.isdigit() else -1
    if not 0 <= value <= 19:
        raise InvalidInput(f"{ENV}={plain(text)}: give a whole number of nice levels from 0 (repro500's helpers "
                           f"level with the run) to 19 (default {NICENESS})")
    return value


def step_back(pid: int) -> None:
    """Put process or thread *pid* (a thread's native id) :func:`niceness` levels below the caller's
    own level (Linux keeps one per thread); best effort: where priorities cannot be set, everything
    still runs, only sooner."""
    with suppress(OSError, AttributeError, InvalidInput):
        os.setpriority(os.PRIO_PROCESS, pid, min(os.getpriority(os.PRIO_PROCESS, 0) + niceness(), 19))
