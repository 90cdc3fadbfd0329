"""A team on a real database: PostgreSQL and ``mlflow server`` on it, set up with
docs/team.md's own commands (tests/helpers/teamserver.py), four ``repro500 run``s at once against it,
every run, metric and artifact accounted for, and a database URI's password never written anywhere.

Needs Debian's ``postgresql`` package (initdb, pg_ctl, createuser) and psycopg2; where they are
missing the tests skip saying so, except under CI (.ci/run sets REPRO500_REQUIRE_POSTGRES=1 where
it can install the package), where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import teamserver
from helpers.ports import free_port
from helpers.runs import tool_env, write_recipe

from repro500.redact import REDACTED

MACHINES = 4


def _require_postgres() -> None:
    reason = teamserver.missing()
    if reason is None:
        return
    if os.environ.get("REPRO500_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"REPRO500_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    _require_postgres()
    with teamserver.team_server(tmp_path_factory.mktemp("team")) as server:
        yield server


def test_the_doc_gives_the_commands_this_suite_runs():
    # tests/helpers/teamserver.py runs docs/team.md's commands by what they start with; a new kind of
    # command in the doc must be taught to it, not silently skipped
    heads = [" ".join(c.split()[:2]) for c in teamserver.doc_commands("## 1.")]
    assert heads == ["createuser --pwprompt", "createdb --owner", "pip install", "echo 'db.example.org:5432:mlflow:mlflow:PASSWORD'",
                     "mlflow server", "export MLFLOW_TRACKING_URI=https://mlflow.example.org",
                     "repro500 run", "repro500 verify", "repro500 verify"]


def test_a_database_uri_is_checked_with_one_quick_connection(monkeypatch):
    # no server needed: a closed port refuses at once, where MLflow alone would retry for ~100 s
    pytest.importorskip("psycopg2")
    from repro500.errors import InvalidInput
    from repro500.tracking import store as mlflow_store

    port = free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"postgresql+psycopg2://mlflow:s3cret-pw@127.0.0.1:{port}/mlflow")
    started = time.monotonic()
    with pytest.raises(InvalidInput) as refused:
        mlflow_store.check_usable()
    assert time.monotonic() - started < 20  # loaded machines import SQLAlchemy slowly
    message = str(refused.value)
    assert "Connection refused" in message and "s3cret-pw" not in message and REDACTED in message
    assert "\n" not in message


def test_a_missing_database_driver_is_named(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("psycopg") is not None:
        pytest.skip("psycopg 3 is installed: postgresql:// has its driver")
    from repro500.errors import InvalidInput
    from repro500.tracking import store as mlflow_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://mlflow:s3cret-pw@127.0.0.1:1/mlflow")
    with pytest.raises(InvalidInput, match=r"driver psycopg is not installed.*postgresql\+psycopg2://") as refused:
        mlflow_store.check_usable()
    assert "s3cret-pw" not in str(refused.value)


@pytest.mark.slow
def test_four_runs_at_once_on_a_postgres_backed_server_all_land(team, tmp_path):
    from mlflow.tracking import MlflowClient

    # tests/helpers/runs.py's tiny recipe: two repeats of two epochs, a verdict that passes (one epoch
    # left the band's confidence bound straddling, exit 3)
    recipe = write_recipe(tmp_path / "tiny.yaml")
    commands = teamserver.client_commands()
    export, run_cmd, verify_cmd, verify_stored = commands
    names = {**team.names(), "experiments/quickstart.yaml": str(recipe)}
    key, _, value = teamserver.localise(export, names).removeprefix("export ").partition("=")
    env = tool_env(**{key: value})
    assert env["MLFLOW_TRACKING_URI"] == team.uri

    machines = [tmp_path / f"machine-{i}" for i in range(MACHINES)]
    procs = []
    for machine in machines:  # each in its own working directory, as on separate machines
        machine.mkdir()
        procs.append(subprocess.Popen(["bash", "-c", teamserver.localise(run_cmd, names)], cwd=machine, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, (out[-2000:], err[-2000:], team.server_log())

    run_dirs = []
    for machine in machines:
        found = sorted((machine / "runs").iterdir())
        assert len(found) == 1, found
        run_dirs.append(found[0])
    verifies = [subprocess.Popen(["bash", "-c", teamserver.localise(verify_cmd, {"runs/RUN_ID": f"runs/{d.name}"})],
                                 cwd=d.parent.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for d in run_dirs]
    for proc in verifies:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (out[-2000:], err[-2000:])

    client = MlflowClient(team.uri)
    experiment = client.get_experiment_by_name("repro500/tiny")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert len(runs) == MACHINES * 3  # a parent and two repeats per run: none lost
    for run_dir in run_dirs:
        meta = json.loads((run_dir / "run.json").read_text())["mlflow"]
        assert meta["tracking_uri"] == team.uri
        parent = client.get_run(meta["parent_run_id"])
        assert parent.info.status == "FINISHED" and parent.data.tags["repro500.run_id"] == run_dir.name
        assert {"accuracy_mean", "accuracy_ci_low", "accuracy_ci_high", "loss_mean"} <= set(parent.data.metrics)
        logged = {a.path for a in client.list_artifacts(parent.info.run_id)}
        assert {"manifest.json", "recipe.yaml", "summary.json", "verdict.json"} <= logged, logged
        copy = client.download_artifacts(parent.info.run_id, "manifest.json", str(tmp_path / run_dir.name))
        assert Path(copy).read_bytes() == (run_dir / "manifest.json").read_bytes()
        for k, repeat_id in meta["repeat_run_ids"].items():
            repeat = client.get_run(repeat_id)
            assert repeat.info.status == "FINISHED" and repeat.data.tags["mlflow.parentRunId"] == parent.info.run_id
            steps = [json.loads(line) for line in (run_dir / "repeats" / k / "metrics.jsonl").read_text().splitlines()]
            steps = [s for s in steps if s.get("kind") == "step"]
            assert len(client.get_metric_history(repeat_id, "train/loss")) == len(steps) > 0
            summary = json.loads((run_dir / "repeats" / k / "summary.json").read_text())
            assert repeat.data.metrics["accuracy"] == summary["metrics"]["accuracy"]
            assert {a.path for a in client.list_artifacts(repeat_id)} >= {"summary.json", "metrics.jsonl"}
    # the artifacts are on the server's artifact store, not on the machines
    assert len(list(team.artifacts.rglob("manifest.json"))) == MACHINES
    # and a run is verified from the server alone: another machine, no run directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for run_dir in run_dirs:
        parent_id = json.loads((run_dir / "run.json").read_text())["mlflow"]["parent_run_id"]
        # a wide terminal: the head line naming the run is cut at the terminal's width, never wrapped
        done = subprocess.run(["bash", "-c", teamserver.localise(verify_stored, {"PARENT_RUN_ID": parent_id})],
                              cwd=elsewhere, env={**env, "COLUMNS": "200"}, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        assert run_dir.name in done.stdout
    assert list(elsewhere.iterdir()) == []  # nothing left behind


@pytest.mark.slow
def test_a_password_in_a_database_uri_is_written_nowhere(team, tmp_path):
    recipe = write_recipe(tmp_path / "tiny.yaml", repeats=1)
    done = subprocess.run([sys.executable, "-m", "repro500.cli", "run", str(recipe), "--experiment", "repro500/direct"],
                          cwd=tmp_path, env=tool_env(MLFLOW_TRACKING_URI=team.db_uri()), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode in (0, 3), done.stderr[-2000:]  # one repeat: inconclusive at most
    secret = team.password
    assert secret not in done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())["mlflow"]
    assert meta["tracking_uri"] == f"postgresql+psycopg2://{REDACTED}@127.0.0.1:{team.pg.port}/mlflow"
    # every file this run wrote: the run directory, the local artifact store a database URI implies
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    # everything MLflow stored (params, tags, metrics, artifact locations), read from the database
    dump = subprocess.run([str(team.pg.bindir / "pg_dump"), "--data-only", "mlflow"], env=tool_env(**team.pg.admin_env()),
                          capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, dump.stderr
    assert meta["parent_run_id"] in dump.stdout  # the dump holds the run, and not the password
    assert secret not in dump.stdout


@pytest.mark.slow
@pytest.mark.parametrize("case", ["wrong password", "server down"])
def test_a_database_that_refuses_fails_in_one_line_and_writes_nothing(team, tmp_path, case):
    recipe = write_recipe(tmp_path / "tiny.yaml")
    wrong = "wrong-" + team.password
    uri = team.db_uri(password=wrong) if case == "wrong password" else team.db_uri(port=free_port())
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "repro500.cli", "run", str(recipe), "--run-id", "refused"],
                          cwd=tmp_path, env=tool_env(MLFLOW_TRACKING_URI=uri), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert done.returncode == 4, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("repro500: error: MLflow tracking store"), done.stderr[-2000:]
    assert "is unreachable" in lines[0] and REDACTED in lines[0]
    assert ("password authentication failed" if case == "wrong password" else "Connection refused") in lines[0]
    assert team.password not in done.stdout + done.stderr and wrong not in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made
    assert elapsed < 60  # one connection, not MLflow's ten retries with back-off (~100 s)


@pytest.mark.slow
def test_a_teammates_run_is_reproduced_by_its_id_on_the_server(team, tmp_path):
    """The run id seen in the team's MLflow UI is all another machine needs: the sealed run comes
    from the server's artifact store, and the rerun there verifies against it."""
    from mlflow.tracking import MlflowClient

    machine = tmp_path / "machine"
    machine.mkdir()
    (machine / "s.py").write_text("import numpy as np\nprint('acc', float(np.float64(0.5) + np.float64(0.4)))\n")
    env = tool_env(MLFLOW_TRACKING_URI=team.uri)
    ran = subprocess.run([sys.executable, "-m", "repro500.cli", "run", "--command", "--metric", "acc=regex:acc ([0-9.]+)",
                          "--accept", "acc>=0.5±0.05", "-n", "3", "--tracking", "--experiment", "repro500/byid",
                          "--run-id", "orig", "--", sys.executable, "s.py"],
                         cwd=machine, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-2000:], team.server_log())
    client = MlflowClient(team.uri)
    runs = client.search_runs([client.get_experiment_by_name("repro500/byid").experiment_id])
    parent = next(r for r in runs if "repro500.repeat" not in r.data.tags)
    assert parent.data.tags["repro500.run_id"] == "orig"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "repro500.cli", "reproduce", f"mlflow:{parent.info.run_id}",
                           "--run-code", "--out", str(tmp_path / "rep")],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    assert "fetching the sealed run of" in done.stdout
    verdict = json.loads((tmp_path / "rep" / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED"
