"""MLflow as its users expect: names, datasets, artifacts beside the store, and a
run verified from the store alone with ``repro500 verify mlflow:RUN_ID``."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest
from helpers.runs import invoke, repro500
from helpers.stores import mlflow_store

from repro500.tracking.names import is_history, verdict_metrics

# A user's project: a two-file script (its helper module beside it) reading data that lives
# outside the project, printing its accuracy.
TRAIN = """
import sys
from helper import score
with open(sys.argv[1], encoding="utf-8") as fh:
    rows = fh.read().split()
print(f"Acc {score(rows):.3f}")
"""
HELPER = """
import os
def score(rows):
    return 0.9 + 0.01 * (int(os.environ.get("REPRO500_REPEAT", "0")) % 3) + 0.0 * len(rows)
"""


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One command run, two repeats, logged to a SQLite store in another directory than the one
    the run starts in."""
    root = tmp_path_factory.mktemp("conventions")
    project, store, data = root / "project", root / "store", root / "data"
    for folder in (project, store, data):
        folder.mkdir()
    (project / "train.py").write_text(textwrap.dedent(TRAIN))
    (project / "helper.py").write_text(textwrap.dedent(HELPER))
    (data / "rows.txt").write_text("1 2 3 4\n")
    env = {"MLFLOW_TRACKING_URI": mlflow_store(store / "mlflow.db")}
    done = repro500("run", "--repeats", "2", "--run-id", "c", "--metric", "accuracy=regex:Acc ([0-9.]+)",
                    "--accept", "accuracy>=0.5", "--command", "--", "python", "train.py", str(data / "rows.txt"),
                    cwd=project, env=env, timeout=300)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    meta = json.loads((project / "runs/c/run.json").read_text())["mlflow"]
    return {"root": root, "project": project, "store": store, "data": data, "env": env, "client": client,
            "parent": client.get_run(meta["parent_run_id"]),
            "repeats": {int(k): client.get_run(v) for k, v in meta["repeat_run_ids"].items()}}


def test_verdict_figures_are_named_as_in_dvc_with_underscores():
    doc = {"status": "PASS", "exit_code": 0, "alpha": 0.05,
           "statistics": {"accuracy": {"n": 3, "mean": 0.9, "std": 0.01, "cv": 0.011, "ci_low": 0.88, "ci_high": 0.92},
                          "throughput_samples_per_s": {"n": 3, "mean": 400.0, "cv": 0.02, "std": 8.0}},
           "bands": [{"metric": "accuracy", "direction": "higher", "threshold": 0.85, "lower_bound": 0.885,
                      "upper_bound": 0.915, "bound": 0.885, "bound_side": "lower", "margin": 0.035,
                      "status": "PASS"}],
           "time_to_train": {"status": "SKIPPED"}}
    metrics, tags = verdict_metrics(doc)
    assert metrics == {"exit_code": 0.0, "alpha": 0.05, "accuracy_n": 3.0, "accuracy_mean": 0.9, "accuracy_std": 0.01,
                       "accuracy_cv": 0.011, "accuracy_ci_low": 0.88, "accuracy_ci_high": 0.92,
                       "accuracy_band_threshold": 0.85, "accuracy_band_bound": 0.885, "accuracy_band_margin": 0.035,
                       "throughput_samples_per_s_mean": 400.0, "throughput_samples_per_s_cv": 0.02}
    assert tags == {"repro500.verdict": "PASS", "verdict": "PASS", "repro500.verdict.accuracy.band.status": "PASS",
                    "repro500.verdict.accuracy.band.bound_side": "lower",
                    "repro500.verdict.time_to_train.status": "SKIPPED"}


def test_one_name_per_quantity_from_repeat_to_parent(logged):
    parent, repeats = logged["parent"], logged["repeats"]
    verdict = json.loads((logged["project"] / "runs/c/verdict.json").read_text())
    for k, run in repeats.items():
        summary = json.loads((logged["project"] / f"runs/c/repeats/{k}/summary.json").read_text())
        assert run.data.metrics["accuracy"] == summary["metrics"]["accuracy"]
        outcome = sorted(n for n, v in summary["metrics"].items() if isinstance(v, (int, float)))
        assert sorted(k for k in run.data.metrics if not is_history(k)) == outcome
        assert run.info.run_name == f"c-repeat-{k}"
        assert run.data.tags["mlflow.source.name"] == parent.data.tags["mlflow.source.name"]
    assert parent.data.metrics["accuracy_mean"] == pytest.approx(verdict["statistics"]["accuracy"]["mean"])
    assert parent.data.metrics["accuracy_ci_low"] == pytest.approx(verdict["statistics"]["accuracy"]["ci_low"])
    assert parent.data.tags["repro500.verdict"] == verdict["status"]
    assert not [k for k in parent.data.metrics if k.startswith("mean_")]


def test_the_data_a_command_read_is_an_mlflow_dataset_input(logged):
    md5 = hashlib.md5((logged["data"] / "rows.txt").read_bytes()).hexdigest()  # noqa: S324 - DVC's digest
    for run in (logged["parent"], *logged["repeats"].values()):
        got = logged["client"].get_run(run.info.run_id).inputs.dataset_inputs
        assert [(d.dataset.name, d.dataset.digest, d.dataset.source) for d in got] == [
            ("rows.txt", md5, str(logged["data"] / "rows.txt"))], run.info.run_name


def test_artifacts_land_beside_the_store_not_where_the_run_started(logged):
    experiment = logged["client"].get_experiment(logged["parent"].info.experiment_id)
    assert Path(experiment.artifact_location) == logged["store"] / "mlartifacts"
    assert not (logged["project"] / "mlruns").exists() and not (logged["project"] / "mlartifacts").exists()
    assert (logged["store"] / "mlartifacts" / logged["parent"].info.run_id / "artifacts/run/c.tar.gz").is_file()


@pytest.mark.slow
def test_verify_mlflow_run_id_checks_the_sealed_run_from_the_store_alone(logged):
    elsewhere = logged["root"] / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    parent_id = logged["parent"].info.run_id
    expected = json.loads((logged["project"] / "runs/c/verdict.json").read_text())
    scratch = logged["root"] / "scratch"  # where the download goes: it must be gone afterwards
    scratch.mkdir(exist_ok=True)
    for ref in (f"mlflow:{parent_id}", f"runs:/{logged['repeats'][1].info.run_id}"):  # a repeat leads to its parent
        done = repro500("verify", ref, "--json", "--check-tracking", cwd=elsewhere,
                        env={**logged["env"], "TMPDIR": str(scratch)})
        verdict = json.loads(done.stdout)
        assert done.returncode == expected["exit_code"], done.stderr[-2000:]
        assert verdict["status"] == expected["status"] and verdict["run_id"] == "c"
        assert verdict["run_dir"].startswith(ref) and verdict["integrity"]["ok"]
        assert any("MLflow agrees" in note for note in verdict["integrity"]["notes"])
    assert list(elsewhere.iterdir()) == [] and list(scratch.iterdir()) == []  # the download is gone


def test_verify_mlflow_refuses_in_one_sentence(logged, tmp_path):
    client = logged["client"]
    plain = client.create_run(logged["parent"].info.experiment_id, run_name="not-ours").info.run_id
    unfinished = client.create_run(logged["parent"].info.experiment_id, tags={"repro500.run_id": "x"}).info.run_id
    cases = {
        "mlflow:0123456789abcdef0123456789abcdef": "there is no MLflow run 0123456789abcdef0123456789abcdef",
        f"mlflow:{plain}": "is not a repro500 run",
        f"mlflow:{unfinished}": "holds no sealed run",
        "mlflow:": "names no MLflow run",
    }
    # the first through the console script, the others in this process (each `verify mlflow:` process
    # imports MLflow, about 3 s of CPU); in both, one sentence and exit 4
    (first, message), *others = cases.items()
    done = repro500("verify", first, cwd=tmp_path, env=logged["env"])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 4 and len(lines) == 1 and message in lines[0], (first, done.stderr[-1500:])
    for ref, message in others:
        said = invoke("verify", ref, env=logged["env"])
        assert said.exit_code == 4 and message in said.text and "Traceback" not in said.output, (ref, said.output)
    missing = repro500("verify", f"mlflow:{plain}", cwd=tmp_path,
                       env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'none.db'}"})
    assert missing.returncode == 4 and "does not exist here" in missing.stderr
    assert not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_artifacts_option_and_its_refusal(tmp_path):
    env = {"MLFLOW_TRACKING_URI": mlflow_store(tmp_path / "mlflow.db")}
    refused = repro500("run", "--no-tracking", "--artifacts", str(tmp_path / "a"), "--metric", "accuracy=regex:Acc ([0-9.]+)",
                       "--accept", "accuracy>=0.5", "--command", "--", "python", "-c", "print('Acc 1')", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "does not go with --no-tracking" in refused.stderr
    assert not (tmp_path / "runs").exists()
    bad = repro500("run", "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5", "--command", "--",
                   "python", "-c", "print('Acc 1')", cwd=tmp_path, env={**env, "REPRO500_MLFLOW_SEALED_MAX_MB": "lots"})
    assert bad.returncode == 2 and "REPRO500_MLFLOW_SEALED_MAX_MB='lots' is not a size" in bad.stderr, bad.stderr
    assert not (tmp_path / "runs").exists()
    done = repro500("run", "--repeats", "1", "--run-id", "a", "--experiment", "mine", "--artifacts", str(tmp_path / "elsewhere"),
                    "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5", "--command", "--", "python",
                    "-c", "print('Acc 1')", cwd=tmp_path, env=env)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_experiment_by_name("mine")
    assert Path(experiment.artifact_location) == tmp_path / "elsewhere"
    assert list((tmp_path / "elsewhere").rglob("a.tar.gz"))
    # an experiment's location is fixed: another --artifacts is said once, as a warning, and not used
    again = repro500("run", "--repeats", "1", "--run-id", "b", "--experiment", "mine", "--artifacts", str(tmp_path / "other"),
                     "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5", "--command", "--", "python",
                     "-c", "print('Acc 1')", cwd=tmp_path, env=env)
    assert again.returncode in (0, 3), again.stderr[-2000:]
    said = " ".join((again.stdout + again.stderr).split())
    assert said.count("--artifacts applies to new experiments only") == 1, said
    assert f"keeps its artifacts in {tmp_path / 'elsewhere'}" in said
    assert list((tmp_path / "elsewhere").rglob("b.tar.gz")) and not (tmp_path / "other").exists()


def test_check_tracking_against_a_refusing_database_fails_fast_without_the_password(logged, monkeypatch):
    import socket
    import time

    from repro500.attest.tracking_check import check_tracking

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"postgresql+psycopg2://team:hunter2-secret@127.0.0.1:{port}/mlflow")
    started = time.monotonic()
    result = check_tracking(logged["project"] / "runs/c")
    assert time.monotonic() - started < 30  # one connection, not MLflow's ten retries (~100 s)
    (problem,) = result.problems
    assert "is unreachable" in problem and "hunter2-secret" not in problem and result.compared == 0


@pytest.mark.slow
def test_a_run_over_the_size_limit_is_not_copied_into_the_store_and_verify_says_why(tmp_path):
    env = {"MLFLOW_TRACKING_URI": mlflow_store(tmp_path / "mlflow.db"), "REPRO500_MLFLOW_SEALED_MAX_MB": "0.000001"}
    done = repro500("run", "--repeats", "1", "--run-id", "big", "--metric", "accuracy=regex:Acc ([0-9.]+)",
                    "--accept", "accuracy>=0.5", "--command", "--", "python", "-c", "print('Acc 1')", cwd=tmp_path, env=env)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    parent_id = json.loads((tmp_path / "runs/big/run.json").read_text())["mlflow"]["parent_run_id"]
    refused = repro500("verify", f"mlflow:{parent_id}", cwd=tmp_path, env=env)
    assert refused.returncode == 4 and "REPRO500_MLFLOW_SEALED_MAX_MB" in refused.stderr, refused.stderr
    assert not list(tmp_path.rglob("big.tar.gz"))


def test_the_outcome_is_the_latest_value_even_when_it_differs_from_the_last_evaluation(tmp_path):
    from mlflow.tracking import MlflowClient

    from repro500.tracking.client import Tracker

    tracker = Tracker("t", mlflow_store(tmp_path / "mlflow.db"))
    tracker.start_parent("p", {}, {})
    run_id = tracker.start_repeat(0, {"repro500.run_id": "p"})
    steps = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
    tracker.log_epoch(run_id, {"epoch": 1, "metrics": {"accuracy": 0.9, "loss": 0.4}}, steps)
    tracker.end_repeat(run_id, {"metrics": {"accuracy": 0.8, "loss": 0.4}, "status": "completed"}, [], "FINISHED")
    run = MlflowClient(tracker.uri).get_run(run_id)
    assert run.data.metrics["accuracy"] == 0.8 and run.data.metrics["loss"] == 0.4
    history = MlflowClient(tracker.uri).get_metric_history(run_id, "accuracy")
    assert sorted((m.step, m.value) for m in history) == [(2, 0.8), (2, 0.9)]
    assert len(MlflowClient(tracker.uri).get_metric_history(run_id, "loss")) == 1  # the same value: logged once


@pytest.mark.slow
def test_check_tracking_with_metrics_named_like_histories_or_old_outcomes(tmp_path):
    env = {"MLFLOW_TRACKING_URI": mlflow_store(tmp_path / "mlflow.db")}
    done = repro500("run", "--repeats", "1", "--run-id", "n", "--metric", "final_score=regex:S ([0-9.]+)",
                    "--metric", "epoch_time=regex:T ([0-9.]+)", "--accept", "final_score>=0.5", "--command", "--",
                    "python", "-c", "print('S 0.9'); print('T 3.5')", cwd=tmp_path, env=env)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    verified = repro500("verify", "runs/n", "--check-tracking", "--json", "--no-write", cwd=tmp_path, env=env)
    integrity = json.loads(verified.stdout)["integrity"]
    assert integrity["problems"] == [] and any("MLflow agrees" in n for n in integrity["notes"]), integrity


@pytest.mark.slow
def test_a_resumed_run_keeps_logging_into_its_own_experiment(tmp_path):
    env = {"MLFLOW_TRACKING_URI": mlflow_store(tmp_path / "mlflow.db")}
    code = ("import os, sys\nif os.environ['REPRO500_REPEAT'] == '1' and not os.path.exists(sys.argv[1]):\n"
            "    open(sys.argv[1], 'w').close(); sys.exit(3)\nprint('Acc 0.9')")
    first = repro500("run", "-n", "3", "--run-id", "r", "--experiment", "mine", "--metric", "accuracy=regex:Acc ([0-9.]+)",
                     "--accept", "accuracy>=0.5", "--command", "--", "python", "-c", code, str(tmp_path / "mark"),
                     cwd=tmp_path, env=env)
    assert first.returncode == 5, first.stderr[-2000:]  # repeat 1 failed; repeat 0 is kept
    second = repro500("run", "--resume", "runs/r", cwd=tmp_path, env=env)  # --experiment is not repeated
    assert second.returncode in (0, 3), second.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    meta = json.loads((tmp_path / "runs/r/run.json").read_text())["mlflow"]
    mine = client.get_experiment_by_name("mine")
    assert meta["experiment"] == "mine" and meta["experiment_id"] == mine.experiment_id
    for run_id in [meta["parent_run_id"], *meta["repeat_run_ids"].values()]:
        assert client.get_run(run_id).info.experiment_id == mine.experiment_id
    assert client.get_experiment_by_name("repro500/r") is None and client.get_experiment_by_name("repro500/command") is None


def test_artifacts_go_one_after_another_into_a_local_store_and_side_by_side_to_a_remote_one(tmp_path, monkeypatch):
    import threading

    from repro500.tracking import client as tracking

    tracker = tracking.Tracker("t", mlflow_store(tmp_path / "mlflow.db"))
    run_id = tracker.start_repeat(0, {"repro500.run_id": "p"})
    files = []
    for name in ("stdout.txt", "stderr.txt", "summary.json"):
        files.append(tmp_path / name)
        files[-1].write_text(name)
    threads = []
    real = tracker.client.log_artifact
    monkeypatch.setattr(tracker.client, "log_artifact",
                        lambda *a, **k: threads.append(threading.current_thread()) or real(*a, **k))
    tracker.log_artifacts(run_id, files)
    assert threads == [threading.current_thread()] * 3  # a local directory: no thread pool to wait on
    assert sorted(a.path for a in tracker.client.list_artifacts(run_id)) == sorted(f.name for f in files)
    assert tracking._is_local(str(tmp_path)) and tracking._is_local(f"file://{tmp_path}")
    assert not tracking._is_local("mlflow-artifacts:/1") and not tracking._is_local("s3://bucket/runs")
