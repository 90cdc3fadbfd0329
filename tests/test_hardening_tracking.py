"""Tracking under stress: concurrent first use of a new SQLite store, secrets in MLflow's own errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.fake_tracking import FakeTrackingServer
from helpers.runs import tool_env

from repro500.redact import REDACTED

ROOT = Path(__file__).resolve().parents[1]

# Each client imports everything first, then waits for the go file, so all four open the new store at once.
CLIENT = """
import os, sys, time
from pathlib import Path
from repro500.tracking import client as tracking
go = Path(sys.argv[1])
Path(f"{go}.ready-{sys.argv[2]}").touch()
while not go.exists():
    time.sleep(0.005)
tracker = tracking.Tracker("repro500/race")
run_id = tracker.start_parent(sys.argv[2], {"recipe.name": "race"}, {"repro500.run_id": sys.argv[2]})
tracker.end_parent("FINISHED")
print(run_id)
"""


@pytest.mark.slow
def test_four_clients_at_once_on_a_new_sqlite_store_all_land(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, str(go), f"client-{i}"], cwd=tmp_path,
                              env=tool_env(PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=uri), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    results = [p.communicate(timeout=240) for p in procs]
    for proc, (_out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err[-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("repro500/race")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == [f"client-{i}" for i in range(4)]
    assert {r.info.run_id for r in runs} == {out.strip() for out, _ in results}
    assert not (db.parent / "mlflow.db.lock").exists()  # the lock was the directory's: nothing left behind


@pytest.mark.parametrize("uri", ["http://user:s3cretpw@127.0.0.1:1", "http://user:s3cretpw@127.0.0.1/"])
@pytest.mark.slow
def test_mlflow_error_text_never_carries_the_tracking_password(tmp_path, uri):
    from helpers.runs import write_recipe

    recipe = write_recipe(tmp_path / "tiny.yaml")
    env = tool_env(PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=uri)
    out = subprocess.run([sys.executable, "-m", "repro500.cli", "run", str(recipe), "--run-id", "leak"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 4, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("repro500: error: MLflow tracking store"), out.stderr
    assert "is unreachable" in lines[0] and "127.0.0.1" in lines[0] and REDACTED in lines[0]
    assert "s3cretpw" not in out.stdout + out.stderr
    assert not (tmp_path / "runs" / "leak").exists()  # refused before anything was captured


def test_text_artifacts_holding_a_secret_are_logged_as_redacted_copies(tmp_path, monkeypatch):
    from repro500.tracking.client import redacted_copy

    monkeypatch.setenv("WANDB_API_KEY", "wandb-0123456789")
    clean = tmp_path / "summary.json"
    clean.write_text('{"loss": 0.5}\n')
    leaky = tmp_path / "recipe.yaml"
    leaky.write_text("fixed:\n  model_options:\n    note: wandb-0123456789\n")
    binary = tmp_path / "weights.pt"
    binary.write_bytes(b"\x00wandb-0123456789")
    with redacted_copy(clean) as path:
        assert path == clean
    with redacted_copy(binary) as path:
        assert path == binary
    with redacted_copy(leaky) as path:
        assert path != leaky and path.name == "recipe.yaml"
        assert path.read_text() == f"fixed:\n  model_options:\n    note: {REDACTED}\n"
    assert not path.exists()  # the copy is temporary
    assert "wandb-0123456789" in leaky.read_text()  # the run directory is never rewritten


def test_store_lock_sits_beside_sqlite_files_only(tmp_path):
    from repro500.tracking.store import sqlite_path, store_lock

    assert sqlite_path("sqlite:////srv/lab/mlflow.db") == Path("/srv/lab/mlflow.db")
    assert sqlite_path("sqlite:///mlflow.db?mode=ro") == Path("mlflow.db")
    assert sqlite_path("sqlite://") is None and sqlite_path("http://host:5000") is None
    import fcntl

    with store_lock(f"sqlite:///{tmp_path}/x.db"):
        other = os.open(tmp_path, os.O_RDONLY)  # another process's attempt: the directory is held
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert list(tmp_path.iterdir()) == []  # nothing left beside the store
    with store_lock("http://127.0.0.1:1"):
        pass


def _failing_artifacts(monkeypatch, marker):
    from repro500.tracking import client as tracking

    def broken(self, run_id, files):
        marker.write_text("failed")
        raise OSError("disk full")

    monkeypatch.setattr(tracking.Tracker, "log_artifacts", broken)
    monkeypatch.setenv("REPRO500_MLFLOW_PROCESS", "0")  # the patch is this process's: MLflow stays in it


def _command(code: str, repeats: int = 3) -> dict:
    return {"schema": "repro500/recipe/v1", "name": "t", "repeats": repeats, "seed": 1,
            "fixed": {"workload": "command", "command": [sys.executable, "-c", code]},
            "metrics": {"accuracy": {"regex": "Acc ([0-9.]+)"}},
            "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0}}}


def _nothing_running(uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]


def test_a_tracking_failure_during_the_repeats_stops_the_run_after_the_repeat_in_flight(tmp_path, monkeypatch):
    from repro500.errors import InvalidInput
    from repro500.runner import RunOptions, run

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    from repro500.tracking import client as tracking

    marker = tmp_path / "failed.txt"

    def unopenable(self, *args, **kwargs):  # the store fails while repeat 0 runs
        marker.write_text("failed")
        raise OSError("disk full")

    monkeypatch.setattr(tracking.Tracker, "__init__", unopenable)
    monkeypatch.setenv("REPRO500_MLFLOW_PROCESS", "0")  # the patch is this process's: MLflow stays in it
    wait = f"import os, time\nwhile not os.path.exists({str(marker)!r}): time.sleep(0.05)\nprint('Acc 0.9')"
    with pytest.raises(InvalidInput, match=r"logging to the MLflow tracking store .* failed \(disk full\)"):
        run(RunOptions(adhoc=_command(wait), run_id="r"))
    meta = json.loads((tmp_path / "runs/r/run.json").read_text())
    assert meta["status"] == "failed" and not (tmp_path / "runs/r/repeats/1").exists()
    assert json.loads((tmp_path / "runs/r/repeats/0/summary.json").read_text())["status"] == "completed"  # kept


def test_a_tracking_failure_found_at_the_end_keeps_the_complete_run_and_says_so(tmp_path, monkeypatch):
    from repro500.errors import InvalidInput
    from repro500.runner import RunOptions, run

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    _failing_artifacts(monkeypatch, tmp_path / "failed.txt")
    with pytest.raises(InvalidInput, match=r"the run itself is complete .*repro500 verify runs/r.* \(disk full\)"):
        run(RunOptions(adhoc=_command("print('Acc 0.9')"), run_id="r"))  # over before MLflow's store is open
    assert json.loads((tmp_path / "runs/r/run.json").read_text())["status"] == "completed"
    assert (tmp_path / "runs/r/verdict.json").is_file()
    _nothing_running(uri)


@pytest.mark.slow
def test_mlflow_info_lines_stay_out_of_a_tracked_runs_output(tmp_path):
    from helpers.runs import repro500, write_recipe

    write_recipe(tmp_path / "tiny.yaml", fixed__epochs=1, repeats=1)
    done = repro500("run", "tiny.yaml", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/new.db"})
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr
    assert "INFO mlflow" not in done.stdout + done.stderr  # "Creating initial MLflow database tables..."
    assert sorted(p.name for p in tmp_path.glob("new.db*")) == ["new.db"]


@pytest.mark.parametrize("delay_s, usable", [(0.0, True), (2.5, True), (30.0, False)])
def test_a_busy_tracking_server_is_waited_for_and_a_silent_one_refused(monkeypatch, delay_s, usable):
    # a server that took the connection is there: a slow /health is waited for (HEALTH_ANSWER_S more),
    # not refused as unreachable after HEALTH_CONNECT_S, as four runs at once on one server met it
    from repro500.errors import InvalidInput
    from repro500.tracking import store as mlflow_store

    monkeypatch.setattr(mlflow_store, "HEALTH_CONNECT_S", 1)
    monkeypatch.setattr(mlflow_store, "HEALTH_ANSWER_S", 4)
    server = FakeTrackingServer(health_delay_s=delay_s)
    try:
        if usable:
            assert mlflow_store.check_usable(server.uri) == server.uri
        else:
            with pytest.raises(InvalidInput, match=r"unreachable \(it took the connection but did not answer "
                                                   r"/health within 5 s\)"):
                mlflow_store.check_usable(server.uri)
    finally:
        server.close()


def test_a_tracking_server_port_nobody_listens_on_is_refused_at_once(monkeypatch):
    from helpers.ports import free_port

    from repro500.errors import InvalidInput
    from repro500.tracking import store as mlflow_store

    started = time.monotonic()
    with pytest.raises(InvalidInput, match=r"unreachable \(\[Errno 111\] Connection refused\)"):
        mlflow_store.check_usable(f"http://127.0.0.1:{free_port()}")
    assert time.monotonic() - started < mlflow_store.HEALTH_CONNECT_S
