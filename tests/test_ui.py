"""`repro500 ui`: MLflow's UI on loopback over repro500's store, read back through MLflow's REST API."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers.ports import free_port
from helpers.runs import write_recipe
from helpers.stores import mlflow_store

from repro500.errors import InvalidInput
from repro500.runner import RunOptions, run
from repro500.tracking import ui


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow  # make test stays under 10 minutes on 2 cores; CI runs make test-slow
def test_ui_serves_repro500_runs_on_loopback(in_tmp, monkeypatch):
    uri = f"sqlite:///{in_tmp / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run(RunOptions(recipe=str(write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=1))))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "ui", "--port", str(port)], cwd=in_tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()  # printed once the UI answers
        assert f"http://127.0.0.1:{port}" in line, line
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            assert response.status == 200
        experiments = _post(f"{base}/api/2.0/mlflow/experiments/search", {"max_results": 10})["experiments"]
        exp = next(e for e in experiments if e["name"] == "repro500/tiny")
        runs = _post(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
        assert len(runs) == 2  # the parent and one repeat
        tags = [{t["key"]: t["value"] for t in r["data"]["tags"]} for r in runs]
        parent = next(t for t in tags if "mlflow.parentRunId" not in t)
        child = next(t for t in tags if "mlflow.parentRunId" in t)
        assert parent["repro500.verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
        assert parent["repro500.manifest_digest"] and child["repro500.repeat"] == "0"
        for r in runs:  # params on parent and repeats alike, so runs compare side by side
            assert {"fixed.model", "mutable.batch_size"} <= {p["key"] for p in r["data"].get("params", [])}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    deadline = time.monotonic() + 10  # its workers close the port as they are scheduled to exit
    while ui.port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ui.port_in_use("127.0.0.1", port)  # the server and its workers are gone


def test_ui_refuses_a_missing_store(in_tmp, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(InvalidInput, match="no MLflow store"):
        ui.start(port=free_port())


@pytest.mark.slow  # starts MLflow's server: 10-30 s on a shared 2-core machine
def test_ui_stopped_by_sigterm_takes_its_server_along(in_tmp):
    """`kill PID` (a service manager, a batch system, a closed terminal) must not leave MLflow's server
    answering on the port: repro500 passes the signal to the server's whole process group."""
    from repro500.tracking.store import open_store

    uri = f"sqlite:///{in_tmp / 'mlflow.db'}"
    open_store(uri)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "ui", "--port", str(port),
                             "--backend-store-uri", uri], cwd=in_tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the UI answers
        assert f"http://127.0.0.1:{port}" in line, line + proc.stderr.read() if proc.poll() is not None else line
        assert ui.port_in_use("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr.read()
    deadline = time.monotonic() + 10
    while ui.port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ui.port_in_use("127.0.0.1", port)  # the server and its workers are gone


# A stand-in server: a process group of a shell and a grandchild, like mlflow server and uvicorn.
SERVE = """
import subprocess, sys
from repro500.tracking import ui

def start(backend_uri, host, port):
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    return proc, "http://127.0.0.1:1"

ui.start = start
sys.exit(ui.serve(on_ready=lambda url: print("ready", flush=True)))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_reaches_the_servers_whole_process_group(tmp_path, sig):
    import os

    proc = subprocess.Popen([sys.executable, "-c", SERVE], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 1
        group = os.getpgid(int(children[0]))
        proc.send_signal(sig)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read()
    from repro500.workloads.command.process import group_alive

    deadline = time.monotonic() + 5
    # (not pgrep: it lists zombies, which stay in a container whose PID 1 reaps no orphans)
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(group)  # the shell and its grandchild are both gone


# ------------------------------------------------------------------- which page MLflow's UI opens on


@pytest.mark.parametrize("where", ["logging process", "run's process"])
def test_repro500s_experiments_carry_the_kind_that_opens_the_runs_table(in_tmp, monkeypatch, where):
    """New experiments, and existing ones logged to again, are tagged custom_model_development (the
    runs table), through the logging process every run uses and in the run's own process alike; a
    kind the experiment's owner chose stays."""
    from mlflow.tracking import MlflowClient

    from repro500.tracking import process as tracking_process
    from repro500.tracking.names import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    uri = mlflow_store(in_tmp / "mlflow.db")
    # one logging process answers every connect (each makes a new Tracker there): one MLflow import
    process = tracking_process.ProcessTracker() if where == "logging process" else None
    monkeypatch.setenv(tracking_process.PROCESS_ENV, "0")

    def connect(name: str) -> str:
        tracker = process.connect(name, uri, None) if process else tracking_process.connect(name, uri, None)
        return tracker.experiment_id

    try:
        made = connect("repro500/new")  # a new store and a new experiment
        client = MlflowClient(uri)
        before = client.create_experiment("repro500/made-before")  # as repro500 made them until now
        chosen = client.create_experiment("theirs", tags={EXPERIMENT_KIND_TAG: "genai_development"})
        assert EXPERIMENT_KIND_TAG not in client.get_experiment(before).tags
        assert connect("repro500/made-before") == before and connect("theirs") == chosen
        assert connect("repro500/new") == made  # found again, still tagged once
    finally:
        if process:
            process.close()
    kinds = {e: client.get_experiment(e).tags.get(EXPERIMENT_KIND_TAG) for e in (made, before, chosen)}
    assert kinds == {made: EXPERIMENT_KIND, before: EXPERIMENT_KIND, chosen: "genai_development"}
    assert EXPERIMENT_KIND == "custom_model_development"  # the value MLflow's UI reads as the runs table


def test_the_printed_address_opens_the_latest_runs_table_in_the_model_training_view(monkeypatch):
    """MLflow 3.17's UI picks an experiment's page by the browser's GenAI / Model training switch
    (GenAI unless flipped), not by the tag: `repro500 ui` prints the latest repro500 run's runs table
    with the switch set in the address, else the experiments list with it."""
    calls = []

    def api(url, method, payload):
        calls.append((method, payload))
        if method == "experiments/search":
            return {"experiments": [{"experiment_id": "0"}, {"experiment_id": "7"}]}
        return {"runs": [{"info": {"experiment_id": "7"}}]}

    monkeypatch.setattr(ui, "_api", api)
    base = "http://127.0.0.1:5000"
    assert ui.runs_page(base) == f"{base}/#/experiments/7/runs?workflowType=machine_learning"
    assert calls[1][1]["experiment_ids"] == ["0", "7"]
    assert calls[1][1]["filter"] == "tags.`repro500.run_id` LIKE '%'"  # repro500's runs, not another tool's
    # an experiment a run has given the reader's view opens on it (the verdict, the headline metrics)
    calls.clear()
    monkeypatch.setattr(ui, "_api", lambda url, method, payload: api(url, method, payload) if method != "experiments/search"
                        else {"experiments": [{"experiment_id": "0"}, {"experiment_id": "7", "tags": [
                            {"key": "mlflow.sharedViewState.repro500", "value": "{}"}]}]})
    assert ui.runs_page(base) == f"{base}/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=repro500"
    monkeypatch.setattr(ui, "_api", lambda url, method, payload: {})
    assert ui.runs_page(base) == f"{base}/#/experiments?workflowType=machine_learning"

    def down(url, method, payload):
        raise ConnectionRefusedError

    monkeypatch.setattr(ui, "_api", down)
    assert ui.runs_page(base) == f"{base}/#/experiments?workflowType=machine_learning"
