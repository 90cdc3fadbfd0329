"""The environment a run was started with, before repro500 changed anything in its own process.

A wrapped command gets this environment (plus ``fixed.env`` and the per-repeat variables,
docs/command.md), never ``os.environ`` as it is later on: repro500 and the libraries it imports
set variables for themselves while a run goes on (the runner's ``CUBLAS_WORKSPACE_CONFIG`` for
its own trainer, MLflow's retry settings while a server is probed, threadpoolctl's
``KMP_DUPLICATE_LIB_OK`` when the verdict's statistics are imported during a repeat), and none
of them belongs to the user's program.  So the environment is frozen once, when
:func:`repro500.runner.run` starts, and read from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

_frozen: dict[str, str] | None = None


@contextmanager
def frozen(environ: dict[str, str] | None = None) -> Iterator[None]:
    """Freeze ``os.environ`` as it is now (or *environ*: the one a run's head process froze, in
    the process of a repeat it fanned out) for everything the ``with`` block starts (nested
    blocks keep the outermost freeze)."""
    global _frozen
    previous = _frozen
    if previous is None:
        _frozen = dict(os.environ if environ is None else environ)
    try:
        yield
    finally:
        _frozen = previous


def user_environ() -> dict[str, str]:
    """A copy of the frozen environment, or of ``os.environ`` outside a run."""
    return dict(_frozen if _frozen is not None else os.environ)
