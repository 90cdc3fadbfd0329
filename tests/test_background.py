"""The runner's background work (runner/background.py) steps back for a wrapped command's
processes and not for a trainer that runs in the runner's own process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import SimpleNamespace

from repro500 import priority
from repro500.runner import background


def _niceness_inside(**options: bool) -> int:
    future = background.call_in_background(
        "probe", lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), **options)
    return future.result(timeout=30)


def test_yielding_work_runs_below_the_runner_and_leaves_the_runner_as_it_was():
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _niceness_inside(yielding=True) == min(mine + priority.NICENESS, 19)
    assert _niceness_inside() == mine
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_only_a_wrapped_commands_run_yields():
    assert background.yields_cpu(SimpleNamespace(is_command=True))
    assert not background.yields_cpu(SimpleNamespace(is_command=False))


def test_a_run_that_nice_already_lowered_keeps_its_helpers_below_it():
    # a run started as `nice -n 12 repro500 run ...`: its helpers go to 19, never back up to 10
    # (as root, setting an absolute 10 would have raised them above the run)
    probe = ("import os, threading; os.nice(12); from repro500.runner import background; "
             "print(background.call_in_background('probe', lambda: os.getpriority(os.PRIO_PROCESS, "
             "threading.get_native_id()), yielding=True).result(timeout=30))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == min(os.getpriority(os.PRIO_PROCESS, 0) + 12 + priority.NICENESS, 19)
