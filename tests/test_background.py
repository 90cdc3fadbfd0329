"""The runner's background work (runner/background.py) steps back for a wrapped command's
processes and not for a trainer that runs in the runner's own process."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

from repro500.runner import background


def _niceness_inside(**options: bool) -> int:
    future = background.call_in_background(
        "probe", lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), **options)
    return future.result(timeout=30)


def test_yielding_work_runs_below_the_runner_and_leaves_the_runner_as_it_was():
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _niceness_inside(yielding=True) == min(mine + background.NICENESS, 19)
    assert _niceness_inside() == mine
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_only_a_wrapped_commands_run_yields():
    assert background.yields_cpu(SimpleNamespace(is_command=True))
    assert not background.yields_cpu(SimpleNamespace(is_command=False))
