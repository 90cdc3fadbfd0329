"""What a resume records about the run it completes: the experiment's source is
compared with the first attempt's, file by file, so that an unchanged experiment reports no
change and a one-byte edit between the attempts is a result-relevant one; and a run started
with ``--no-tracking`` stays untracked, even with ``MLFLOW_TRACKING_URI`` set.

Each test runs the real CLI twice: the first attempt stops after repeat 0 (a command that fails
once, or Ctrl-C), the second is ``repro500 run --resume``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers.runs import plugin_recipe, repro500

# Repeat 1 fails on the first attempt only; every repeat writes into its working directory (as
# scripts do: logs, checkpoints), which the resume must not take for an edit of the source.
SCRIPT = '''
import os
repeat = os.environ["REPRO500_REPEAT"]
mark = os.environ["FAIL_MARK"]
with open(f"out-{repeat}.log", "w") as log:
    log.write("written by the repeat\\n")
if repeat == "1" and not os.path.exists(mark):
    open(mark, "w").close()
    raise SystemExit("boom: out of disk")
print(f"Acc@1 {90 + int(os.environ['REPRO500_SEED']) % 5}")
'''


def command_experiment(root: Path) -> Path:
    """A command recipe whose working directory is absolute, so that it resumes from anywhere."""
    root.mkdir()
    (root / "train.py").write_text(textwrap.dedent(SCRIPT))
    recipe = {
        "schema": "repro500/recipe/v1", "name": "script",
        "fixed": {"command": [sys.executable, "train.py"], "workdir": str(root)},
        "metrics": {"accuracy": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}},
        "acceptance": {"accuracy": {"target": 0.9, "tolerance": 0.1}},
        "repeats": 3, "seed": 2,
    }
    path = root / "script.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def first_attempt(tmp: Path) -> tuple[Path, dict[str, str]]:
    """Run the command experiment untracked until repeat 1 fails; the run directory and the env."""
    recipe = command_experiment(tmp / "exp")
    env = {"FAIL_MARK": str(tmp / "failed-once"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}"}
    first = repro500("run", str(recipe), "--no-tracking", "--run-id", "r", "--out", str(tmp / "runs"), cwd=tmp, env=env)
    assert first.returncode == 5 and "boom: out of disk" in first.stderr, first.stdout + first.stderr
    run = tmp / "runs" / "r"
    assert [f["path"] for f in json.loads((run / "source.json").read_text())["files"]] == ["script.yaml", "train.py"]
    assert (tmp / "exp" / "out-0.log").is_file()  # the first attempt wrote into the experiment's tree
    return run, env


def last_resume(run: Path) -> dict:
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "completed" and len(meta["resumes"]) == 1, meta
    return meta["resumes"][0]


@pytest.mark.slow
def test_an_unchanged_command_resumed_from_elsewhere_reports_no_change_and_stays_untracked(tmp_path):
    run, env = first_attempt(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = (run / "run.json").read_bytes()
    contrary = repro500("run", "--resume", str(run), "--tracking", cwd=elsewhere, env=env)
    assert contrary.returncode == 2 and "run with --no-tracking, and a resume keeps that choice" in contrary.stderr
    assert (run / "run.json").read_bytes() == before and not (tmp_path / "mlflow.db").exists()
    resumed = repro500("run", "--resume", str(run), cwd=elsewhere, env=env)  # MLFLOW_TRACKING_URI is set
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    resume = last_resume(run)
    # repro500's own source may differ while it is being edited; the experiment's must not
    assert not [d for d in resume["result_relevant_differences"] if d.startswith("experiment.source")], resume
    assert resume["source_changed"] == []
    assert "experiment.source" not in resumed.stdout + resumed.stderr
    meta = json.loads((run / "run.json").read_text())
    assert meta["tracking"] is False and meta["mlflow"] is None
    assert not (tmp_path / "mlflow.db").exists() and not (elsewhere / "mlruns").exists()
    assert repro500("verify", str(run), cwd=tmp_path).returncode == 0


def test_a_one_byte_edit_between_the_attempts_is_a_result_relevant_source_change(tmp_path):
    run, env = first_attempt(tmp_path)
    script = tmp_path / "exp" / "train.py"
    script.write_text(script.read_text().replace("90 +", "91 +"))
    resumed = repro500("run", "--resume", str(run), cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    resume = last_resume(run)
    assert "experiment.source.tree_sha256" in resume["result_relevant_differences"]
    assert resume["source_changed"] == ["train.py"]  # not the logs the repeats wrote beside it
    said = " ".join((resumed.stdout + resumed.stderr).split())
    assert "the environment changed since the run started" in said and "files changed: train.py" in said


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_a_plugin_experiment_interrupted_and_resumed_reports_no_source_change(in_tmp):
    """A trained workload whose model and data come from the user's own modules (kept in source/)."""
    # a target it never reaches (balanced_hits <= 1): repeat 1 must still be running when Ctrl-C
    # comes (it reached 0.999 in 3 epochs, sometimes before the signal landed)
    plugin_recipe(in_tmp, fixed__epochs=150, fixed__target__value=2.0, repeats=2)
    run = in_tmp / "runs" / "p"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{in_tmp / 'mlflow.db'}"}
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "run", "mine.yaml", "--no-tracking", "--run-id", "p"],
                            cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, **env})
    deadline = time.monotonic() + 120
    # Ctrl-C once repeat 0 is finished, the manifest written and repeat 1 under way
    while not ((run / "repeats/0/summary.json").is_file() and (run / "manifest.json").is_file()
               and (run / "repeats/1/metrics.jsonl").is_file()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first attempt did not reach repeat 1"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert json.loads((run / "repeats/1/summary.json").read_text())["status"] == "killed"
    kept = json.loads((run / "manifest.json").read_text())["facets"]["experiment"]["source"]
    assert kept["files"] == 2  # mylab/__init__.py and mylab/nets.py

    resumed = repro500("run", "--resume", "runs/p", cwd=in_tmp, env=env)
    assert resumed.returncode in (0, 1, 3), resumed.stdout + resumed.stderr
    resume = last_resume(run)
    assert not [d for d in resume["result_relevant_differences"] if d.startswith("experiment.source")], resume
    assert resume["source_changed"] == []
    assert json.loads((run / "run.json").read_text())["mlflow"] is None and not (in_tmp / "mlflow.db").exists()
