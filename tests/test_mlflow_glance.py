"""What a reader of one run sees first, in every record alike: the terminal, ``verdict.json``, DVC's
metrics view and MLflow (its runs table, times, seeds, datasets).

One command run that FAILs its band, logged to a SQLite store, serves every test here."""

from __future__ import annotations

import json
import re
import textwrap
import time

import pytest
from helpers.runs import repro500
from helpers.stores import mlflow_store

# A user's script: it reads its data, sleeps a known time, prints an accuracy far below the band
# (a FAIL) and the seed it was given.
TRAIN = """
import os, sys, time
time.sleep(float(os.environ["SLEEP_S"]))
with open(sys.argv[1], encoding="utf-8") as fh:
    rows = fh.read().split()
k = int(os.environ["REPRO500_REPEAT"])
print(f"seed {sys.argv[2]} env {os.environ['REPRO500_SEED']}")
print(f"Acc {0.30 + 0.01 * (k % 3) + 0.0 * len(rows):.3f}")
"""
SLEEP_S = 1.5


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    root = tmp_path_factory.mktemp("glance")
    project, data = root / "project", root / "project" / "data"
    data.mkdir(parents=True)
    (project / "train.py").write_text(textwrap.dedent(TRAIN))
    (data / "rows.txt").write_text("1 2 3 4\n")
    env = {"MLFLOW_TRACKING_URI": mlflow_store(root / "mlflow.db"), "SLEEP_S": str(SLEEP_S), "COLUMNS": "200"}
    started = time.time()
    done = repro500("run", "--repeats", "3", "--run-id", "f", "--metric", "accuracy=regex:Acc ([0-9.]+)",
                    "--accept", "accuracy>=0.9", "--input", "data/rows.txt", "--command", "--",
                    "python", "train.py", "data/rows.txt", "{seed}", cwd=project, env=env, timeout=600)
    ended = time.time()
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run_dir = project / "runs/f"
    meta = json.loads((run_dir / "run.json").read_text())["mlflow"]
    return {"root": root, "project": project, "run_dir": run_dir, "env": env, "client": client, "done": done,
            "started": started, "ended": ended, "parent": client.get_run(meta["parent_run_id"]),
            "repeats": {int(k): client.get_run(v) for k, v in meta["repeat_run_ids"].items()}}


def test_a_fail_names_one_bound_in_the_terminal_verdict_json_dvc_and_mlflow(failed):
    (band,) = json.loads((failed["run_dir"] / "verdict.json").read_text())["bands"]
    assert band["status"] == "FAIL" and band["direction"] == "higher"
    # a miss rests on the far bound: the upper one is below the threshold, and that is the bound
    assert band["bound_side"] == "upper" and band["bound"] == band["upper_bound"] < band["threshold"]
    assert band["margin"] == pytest.approx(band["bound"] - band["threshold"]) and band["margin"] < 0
    said = " ".join(failed["done"].stdout.split())
    shown = re.search(r"accuracy >= 0\.9 3 \S+ (upper|lower) (\S+) FAIL", said)
    assert shown, said[-3000:]
    assert shown.group(1) == "upper" and float(shown.group(2)) == pytest.approx(band["bound"], rel=1e-3)
    dvc_file = failed["root"] / "verdict-metrics.json"
    again = repro500("verify", failed["run_dir"], "--no-write", "--metrics", dvc_file, cwd=failed["project"],
                     env=failed["env"])
    assert again.returncode == 1, again.stderr[-2000:]
    dvc_band = json.loads(dvc_file.read_text())["accuracy"]["band"]
    assert dvc_band["bound"] == band["bound"] and dvc_band["bound_side"] == "upper"
    metrics, tags = failed["parent"].data.metrics, failed["parent"].data.tags
    assert metrics["accuracy_band_bound"] == pytest.approx(band["bound"])
    assert metrics["accuracy_band_margin"] == pytest.approx(band["margin"])
    assert tags["repro500.verdict.accuracy.band.bound_side"] == "upper"
