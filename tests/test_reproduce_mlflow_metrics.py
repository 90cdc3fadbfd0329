"""Reproducing an experiment whose metric its own script logs to MLflow: the rerun is tracked
by itself, into the reproduction's own store, and a rerun that stops keeps its exit code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers.runs import repro500

PY = sys.executable
VENV = {"PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
TRAIN = ("import os, mlflow\nwith mlflow.start_run():\n"
         "    mlflow.log_metric('loss', 0.5 + int(os.environ['REPRO500_SEED']) % 3 / 1000)\n")


@pytest.mark.slow
def test_a_publication_reading_mlflow_reproduces_without_asking_for_tracking(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "train.py").write_text(TRAIN)
    env = {**VENV, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'lab.db'}"}
    done = repro500("run", "--command", "--metric", "loss=mlflow", "--accept", "loss<=1±0.1", "-n", "2",
                    "--run-id", "orig", "--", PY, "train.py", cwd=lab, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    done = repro500("publish", "runs/orig", "--out", str(tmp_path / "pub"), cwd=lab, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--run-code" in done.stdout + done.stderr  # the hint a reproducer copies must work as printed
    assert "--run-code" in (tmp_path / "pub" / "README.md").read_text()

    fresh = tmp_path / "elsewhere"
    fresh.mkdir()
    refused = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--no-tracking", "--out", "no",
                       cwd=fresh, env=VENV)
    assert refused.returncode == 2 and "must be tracked" in refused.stderr, refused.stdout + refused.stderr
    done = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "again", cwd=fresh, env=VENV)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    assert "read from MLflow" in done.stdout and (fresh / "again" / "mlflow.db").is_file()
    assert not (fresh / "again" / "source" / "mlflow.db").exists()

    # a rerun that stops on invalid input (here: a store MLflow refuses) is exit 4, not NOT
    # REPRODUCED, and names no directory it never wrote
    stopped = repro500("reproduce", str(tmp_path / "pub"), "--run-code", "--out", "again", cwd=fresh,
                       env={**VENV, "MLFLOW_TRACKING_URI": f"file://{tmp_path / 'mlruns'}"})
    assert stopped.returncode == 4, stopped.stdout + stopped.stderr
    assert "Traceback" not in stopped.stderr and "it wrote no run directory" in stopped.stderr


@pytest.mark.slow
def test_the_step_by_step_of_a_command_publication_runs_as_written(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "train.py").write_text("import os\nprint(f\"Acc {0.9 + int(os.environ['REPRO500_SEED']) % 3 / 1000}\")\n")
    done = repro500("run", "--command", "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5±0.1",
                    "-n", "2", "--run-id", "orig", "--no-tracking", "--", PY, "train.py", cwd=lab, env=VENV)
    assert done.returncode == 0, done.stdout + done.stderr
    done = repro500("publish", "runs/orig", "--out", str(tmp_path / "pub"), cwd=lab, env=VENV)
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (tmp_path / "pub" / "README.md").read_text()
    block = readme.split("Step by step, in this directory:")[1].split("```console")[1].split("```")[0]
    commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    assert any("unpack" in c for c in commands), commands
    script = "set -e\n" + "\n".join(c.replace("repro500 ", f"{PY} -m repro500.cli ", 1) if c.startswith("repro500")
                                    else c.replace("&& repro500 run", f"&& {PY} -m repro500.cli run --no-tracking")
                                    for c in commands)
    import subprocess

    ran = subprocess.run(["bash", "-c", script], cwd=tmp_path / "pub", capture_output=True, text=True, timeout=300,
                         env={**os.environ, **VENV})
    assert ran.returncode == 0, ran.stdout + ran.stderr
