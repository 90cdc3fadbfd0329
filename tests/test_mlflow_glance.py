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


def test_runs_carry_their_real_start_and_end(failed):
    parent = failed["parent"].info
    wall_s = failed["ended"] - failed["started"]  # the whole `repro500 run` process, as the user waited
    duration_s = (parent.end_time - parent.start_time) / 1000
    assert abs(duration_s - wall_s) <= 0.1 * wall_s, (duration_s, wall_s)
    assert failed["started"] * 1000 <= parent.start_time and parent.end_time <= failed["ended"] * 1000
    previous_end = parent.start_time
    for k, run in sorted(failed["repeats"].items()):
        written = failed["run_dir"] / f"repeats/{k}/summary.json"
        summary = json.loads(written.read_text())
        took_s = (run.info.end_time - run.info.start_time) / 1000
        # the repeat's run spans its command (which sleeps SLEEP_S) and repro500's bookkeeping of it
        # (reading its metrics and what it read), ending as its summary is written
        assert summary["total_time_s"] >= SLEEP_S and took_s >= summary["total_time_s"] - 0.01, (k, took_s)
        assert took_s <= summary["total_time_s"] + 2.0, (k, took_s, summary["total_time_s"])
        assert abs(run.info.end_time / 1000 - written.stat().st_mtime) < 1.0
        assert previous_end <= run.info.start_time and run.info.end_time <= parent.end_time
        previous_end = run.info.end_time


def test_a_repeat_names_the_seed_its_program_received_and_the_torch_seed_apart(failed):
    for k, run in failed["repeats"].items():
        out = (failed["run_dir"] / f"repeats/{k}/stdout.txt").read_text()
        given, in_env = re.search(r"seed (\d+) env (\d+)", out).groups()
        summary = json.loads((failed["run_dir"] / f"repeats/{k}/summary.json").read_text())
        tags = run.data.tags
        assert tags["repro500.seed.program"] == given == in_env
        assert tags["repro500.seed.torch"] == str(summary["seeds"]["torch"]) != given
        assert "repro500.seed" not in tags  # the old name said neither


def test_the_declared_input_of_a_command_is_every_runs_dataset(failed):
    import hashlib

    path = failed["project"] / "data/rows.txt"
    md5 = hashlib.md5(path.read_bytes()).hexdigest()  # noqa: S324 - DVC's digest
    for run in (failed["parent"], *failed["repeats"].values()):
        got = failed["client"].get_run(run.info.run_id).inputs.dataset_inputs
        assert [(d.dataset.name, d.dataset.digest) for d in got] == [("rows.txt", md5)], run.info.run_name
        assert [t.value for t in got[0].tags if t.key == "mlflow.data.context"] == ["input"]



def test_the_experiment_opens_on_the_verdict_and_the_headline_metric(failed):
    parent = failed["parent"]
    assert parent.data.tags["verdict"] == parent.data.tags["repro500.verdict"] == "FAIL"
    experiment = failed["client"].get_experiment(parent.info.experiment_id)
    view = json.loads(experiment.tags["mlflow.sharedViewState.repro500"])  # what `repro500 ui`'s address opens
    assert view["selectedColumns"] == [
        "attributes.`Duration`", "attributes.`Dataset`", "tags.`verdict`", "metrics.`accuracy`",
        "metrics.`accuracy_mean`", "metrics.`accuracy_band_bound`", "metrics.`accuracy_band_margin`"]
    # every column it names is one the parent or a repeat has
    repeat = failed["repeats"][0]
    for column in view["selectedColumns"][2:]:
        kind, key = column.split(".", 1)
        key = key.strip("`")
        assert key in getattr(parent.data, kind) or key in getattr(repeat.data, kind), column


@pytest.mark.slow
def test_report_of_a_run_named_in_mlflow(failed):
    elsewhere = failed["root"] / "report-here"
    elsewhere.mkdir()
    done = repro500("report", f"mlflow:{failed['parent'].info.run_id}", cwd=elsewhere, env=failed["env"])
    assert done.returncode == 0, done.stderr[-2000:]
    written = elsewhere / "f.report.html"
    assert done.stdout.strip().endswith("f.report.html") and written.is_file()
    assert "FAIL" in written.read_text(encoding="utf-8") and sorted(elsewhere.iterdir()) == [written]
    missing = repro500("report", "mlflow:0123456789abcdef0123456789abcdef", cwd=elsewhere, env=failed["env"])
    assert missing.returncode == 4 and "there is no MLflow run" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
