"""An interrupted ``repro500 reproduce`` is finished by the same command: its rerun is continued,
the finished repeats kept, and the reproduction's verdict written.

Ctrl-C is what a terminal sends: SIGINT to the foreground process group, here the reproduce
process's own group (its rerun runs in a group of its own and hears it from reproduce).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.runs import repro500

# each repeat takes about a second: Ctrl-C lands while repeat 1 runs
SLOW = ("import random, sys, time\nrandom.seed(int(sys.argv[1]))\ntime.sleep(1)\n"
        "print(f'acc {float(sys.argv[2]) + random.gauss(0, 0.01):.5f}')\n")


@pytest.fixture(scope="module")
def pub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lab")
    (root / "t.py").write_text(SLOW)
    ran = repro500("run", "--command", "--no-tracking", "--metric", "acc=regex:acc ([0-9.]+)", "--accept",
                   "acc>=0.9±0.03", "--run-id", "orig", "--repeats", "3", "--", "python", "t.py", "{seed}", "0.95",
                   cwd=root)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    done = repro500("publish", "runs/orig", "--out", "pub", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "pub"


def _interrupt_after_first_repeat(pub: Path, cwd: Path) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "reproduce", str(pub), "--out", "OUT", "--run-code"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 120
    while not list((cwd / "OUT" / "runs").glob("*/repeats/0/summary.json")):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the first repeat did not finish"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


@pytest.mark.slow
def test_reproduce_again_continues_the_interrupted_rerun_and_writes_its_verdict(pub: Path, tmp_path: Path) -> None:
    rc, out = _interrupt_after_first_repeat(pub, tmp_path)
    assert rc == 130, out
    # interrupted inside a repeat or between stages: either sentence gives the same command
    assert re.search(rf"[Cc]omplete the run with: {re.escape(f'repro500 reproduce {pub} --out OUT --run-code')}", out), out
    assert "run --resume" not in out and not (tmp_path / "OUT" / "verdict.json").exists()
    (rerun,) = (tmp_path / "OUT" / "runs").iterdir()
    assert json.loads((rerun / "run.json").read_text())["status"] == "interrupted"
    first = rerun / "repeats" / "0" / "summary.json"
    kept = (first.read_bytes(), first.stat().st_mtime_ns)

    other = repro500("reproduce", str(pub), "--out", "OUT", "--run-code", "--repeats", "2", cwd=tmp_path)
    assert other.returncode == 2 and "unfinished rerun" in other.stderr, other.stdout + other.stderr
    assert "1 of 3 repeats finished" in other.stderr

    again = repro500("reproduce", str(pub), "--out", "OUT", "--run-code", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"continuing the rerun OUT/runs/{rerun.name}" in again.stdout
    assert [p.name for p in (tmp_path / "OUT" / "runs").iterdir()] == [rerun.name]
    assert (first.read_bytes(), first.stat().st_mtime_ns) == kept  # kept, not rerun
    verdict = json.loads((tmp_path / "OUT" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED" and Path(verdict["run_dir"]).name == rerun.name


@pytest.mark.slow
def test_a_rerun_that_finished_its_repeats_is_verified_not_run_again(pub: Path, tmp_path: Path) -> None:
    done = repro500("reproduce", str(pub), "--out", "OUT", "--run-code", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (rerun,) = (tmp_path / "OUT" / "runs").iterdir()
    # stopped after the rerun sealed itself, before the reproduction's verdict was written
    (tmp_path / "OUT" / "verdict.json").unlink()
    sealed = (rerun / "SHA256SUMS").read_bytes()
    again = repro500("reproduce", str(pub), "--out", "OUT", "--run-code", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "finished before the reproduction was stopped" in again.stdout and "repeat 0" not in again.stdout
    assert [p.name for p in (tmp_path / "OUT" / "runs").iterdir()] == [rerun.name]
    assert (rerun / "SHA256SUMS").read_bytes() == sealed
    assert json.loads((tmp_path / "OUT" / "verdict.json").read_text())["status"] == "REPRODUCED"
