"""The suite passes however it is started: from a shell that ignores SIGINT too."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def test_interrupt_tests_pass_when_the_suite_starts_with_sigint_ignored(tmp_path):
    # what `nohup make test &` does to the suite: SIGINT ignored from the start, inherited by every child;
    # the test given is parametrized by signal number: [2] is SIGINT
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"),
         str(TESTS / "test_command_workload.py") + "::test_interrupt_is_forwarded_and_recorded_as_killed[2]"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


def test_a_child_of_the_suite_starts_with_sigint_at_its_default():
    shown = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
                           capture_output=True, text=True, check=True).stdout
    assert "default_int_handler" in shown
