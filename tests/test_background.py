"""The runner's background work (runner/background.py) steps back for a wrapped command's
processes and not for a trainer that runs in the runner's own process; a wrapped command's waits
until the command's process has started."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from repro500 import priority
from repro500.runner import background
from repro500.runner import capture as runner_capture
from repro500.workloads.command import process
from tests.helpers.runs import invoke


def _niceness_inside(**options: bool) -> int:
    future = background.call_in_background(
        "probe", lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), **options)
    return future.result(timeout=30)


def test_yielding_work_runs_below_the_runner_and_leaves_the_runner_as_it_was(monkeypatch):
    monkeypatch.delenv(priority.ENV, raising=False)  # the default step
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
    env = {k: v for k, v in os.environ.items() if k != priority.ENV}  # the default step
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == min(os.getpriority(os.PRIO_PROCESS, 0) + 12 + priority.NICENESS, 19)


@pytest.mark.parametrize(("given", "step"), [("0", 0), ("3", 3), ("19", 19), ("", priority.NICENESS)])
def test_the_step_back_is_the_users_to_set(monkeypatch, given, step):
    monkeypatch.setenv(priority.ENV, given)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _niceness_inside(yielding=True) == min(mine + step, 19)


@pytest.mark.parametrize("given", ["-1", "20", "ten", "1.5"])
def test_a_step_back_that_is_not_a_nice_level_is_refused_before_a_run_writes(tmp_path, given):
    done = subprocess.run([sys.executable, "-m", "repro500.cli", "run", "--command", "--no-tracking", "--metric",
                           "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5", "--", sys.executable, "-c",
                           "print('Acc 0.9')"], cwd=tmp_path, env={**os.environ, priority.ENV: given},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"repro500: error: REPRO500_HELPER_NICENESS={given}: give a whole number of nice "
                                   "levels from 0 (repro500's helpers level with the run) to 19 (default 10)")
    assert list(tmp_path.iterdir()) == []


def test_work_given_an_event_waits_for_it():
    gate = threading.Event()
    future = background.call_in_background("probe", lambda: "ran", after=gate)
    assert not gate.wait(0.2) and not future.done()
    gate.set()
    assert future.result(timeout=30) == "ran"


def _record_order(monkeypatch) -> list[str]:
    events: list[str] = []
    real_gather, real_start = runner_capture.gather, process.Child.start.__func__

    def gather(*args, **kwargs):
        events.append("capture")
        return real_gather(*args, **kwargs)

    def start(cls, *args, **kwargs):
        child = real_start(cls, *args, **kwargs)
        events.append("process")
        return child

    monkeypatch.setattr(runner_capture, "gather", gather)
    monkeypatch.setattr(process.Child, "start", classmethod(start))
    return events


def _run_command(*program: str):
    return invoke("run", "--command", "-n", "2", "--no-tracking", "--metric", "accuracy=regex:Acc ([0-9]+)",
                  "--accept", "accuracy>=0", "--", *program)


def test_a_wrapped_commands_capture_starts_once_its_process_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    events = _record_order(monkeypatch)
    result = _run_command(sys.executable, "-c", "print('Acc 90')")
    assert result.exit_code in (0, 3), result.output
    assert events[:2] == ["process", "capture"], events
    assert len(list(tmp_path.glob("runs/*/manifest.json"))) == 1


def test_a_command_that_cannot_start_still_gets_its_manifest(tmp_path, monkeypatch):
    # no process ever runs: the capture must not wait for one (the run would hang at its manifest)
    monkeypatch.chdir(tmp_path)
    events = _record_order(monkeypatch)
    program = tmp_path / "prog"  # passes the check before the run (it exists, may be run); exec fails
    program.write_text("#!/no-such-interpreter\nprint('Acc 90')\n")
    program.chmod(0o755)
    result = _run_command(str(program))
    assert result.exit_code == 5 and "repeat 0 failed" in result.text
    assert "the interpreter its #! line names (/no-such-interpreter) was not found" in result.text
    assert events == ["capture"]
    assert len(list(tmp_path.glob("runs/*/manifest.json"))) == 1


# what a wrapped command's first repeat does not wait for: the verifier's readers and statistics,
# MLflow's client (it lives in its own process), the signature machinery
NOT_BEFORE_THE_FIRST_REPEAT = ("repro500.verify.history", "repro500.verify.reference", "repro500.verify.integrity",
                               "repro500.tracking.client", "repro500.attest.attestation", "cryptography", "mlflow",
                               "numpy", "scipy", "torch")
PROBE = """
import json, sys
from repro500 import cli
from repro500.workloads.command import process
watched, seen = json.loads(sys.argv[1]), []
real = process.Child.start.__func__
def start(cls, *args, **kwargs):
    if not seen:
        seen.append(sorted(m for m in watched if m in sys.modules))
        print("LOADED", json.dumps(seen[0]), flush=True)
    return real(cls, *args, **kwargs)
process.Child.start = classmethod(start)
sys.argv = ["repro500", *sys.argv[2:]]
cli.main()
"""


@pytest.mark.slow
def test_a_wrapped_commands_first_repeat_waits_for_no_reader_it_does_not_need(tmp_path):
    import json

    from tests.helpers.runs import tool_env

    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(NOT_BEFORE_THE_FIRST_REPEAT), "run", "--command", "-n", "1",
         "--metric", "accuracy=regex:Acc ([0-9]+)", "--accept", "accuracy>=0", "--", sys.executable, "-c",
         "print('Acc 90')"], cwd=tmp_path, env=tool_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    assert "LOADED []" in done.stdout, done.stdout
