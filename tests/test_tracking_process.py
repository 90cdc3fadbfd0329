"""MLflow in a process of its own (repro500.tracking.process): the run's process never imports
MLflow, a refused run leaves neither a process nor a store, and a logging process that dies stops
the run after the repeat in flight, in one sentence, with nothing left RUNNING."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.stores import mlflow_store

ROOT = Path(__file__).resolve().parent.parent


def _command(code: str, repeats: int = 2) -> dict:
    return {"schema": "repro500/recipe/v1", "name": "t", "repeats": repeats, "seed": 1,
            "fixed": {"workload": "command", "command": [sys.executable, "-c", code]},
            "metrics": {"accuracy": {"regex": "Acc ([0-9.]+)"}},
            "acceptance": {"accuracy": {"target": 0.5, "direction": "higher", "tolerance": 0}}}


def _logging_processes(parent: int) -> list[int]:
    """The MLflow processes *parent* started that are still alive (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if (fields.get("PPid", "").strip() == str(parent) and not fields.get("State", "").startswith("Z")
                and b"repro500.tracking.process" in cmdline):
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_tracked_run_logs_everything_without_importing_mlflow_itself(tmp_path):
    script = textwrap.dedent(f"""
        import json, sys
        from repro500.runner import RunOptions, run
        recipe = {_command("print('Acc 0.9')")!r}
        outcome = run(RunOptions(adhoc=recipe, run_id="r"))
        print(json.dumps({{"exit": outcome.exit_code, "mlflow": sorted(m for m in sys.modules if m.split(".")[0] == "mlflow")}}))
    """)
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_store(tmp_path / "store.db"))
    env.pop("REPRO500_MLFLOW_PROCESS", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["exit"] == 0 and said["mlflow"] == []  # MLflow lived in the other process only
    from mlflow.tracking import MlflowClient

    meta = json.loads((tmp_path / "runs/r/run.json").read_text())
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.get_run(meta["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.metrics["accuracy_mean"] == pytest.approx(0.9)
    for k in ("0", "1"):
        assert client.get_run(meta["mlflow"]["repeat_run_ids"][k]).data.metrics["accuracy"] == pytest.approx(0.9)
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "run")] == ["run/r.tar.gz"]



@pytest.mark.slow
def test_beside_a_wrapped_command_the_logging_process_yields_the_cpu_and_the_command_does_not(tmp_path):
    """The command's repeats run at the niceness the user started repro500 with, not at the lower
    priority of the runner's background work; MLflow's process 10 below it."""
    code = textwrap.dedent("""
        import os
        from pathlib import Path
        def nice(pid):  # field 19 of /proc/PID/stat, after "pid (comm)"
            stat = Path(f"/proc/{pid}/stat").read_text()
            return int(stat[stat.rfind(")") + 2:].split()[16])
        def logging_child(entry, parent):  # a process may end between listing /proc and reading it
            try:
                return (b"repro500.tracking.process" in (entry / "cmdline").read_bytes()
                        and f"PPid:\t{parent}" in (entry / "status").read_text())
            except OSError:
                return False
        parent = os.getppid()
        logging = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and logging_child(p, parent)]
        print(f"Acc 0.9 own={nice(os.getpid())} runner={nice(parent)} logging={[nice(p) for p in logging]}")
    """)
    (tmp_path / "probe.py").write_text(code)
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_store(tmp_path / "store.db"))
    env.pop("REPRO500_MLFLOW_PROCESS", None)
    env.pop("REPRO500_HELPER_NICENESS", None)  # the default step: 10
    done = subprocess.run([sys.executable, "-m", "repro500.cli", "run", "--command", "-n", "1", "--run-id", "n",
                           "--metric", "accuracy=regex:Acc ([0-9.]+)", "--accept", "accuracy>=0.5", "--",
                           sys.executable, "probe.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    said = (tmp_path / "runs/n/repeats/0/stdout.txt").read_text()
    start = os.getpriority(os.PRIO_PROCESS, 0)
    assert f"own={start} runner={start} logging=[{min(start + 10, 19)}]" in said, said

def test_a_refused_run_leaves_no_logging_process_and_no_store(tmp_path, monkeypatch):
    from repro500.errors import ReproError
    from repro500.runner import RunOptions, run
    from repro500.tracking import process as tracking_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REPRO500_MLFLOW_PROCESS", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    (tmp_path / "bad.yaml").write_text("schema: repro500/recipe/v1\nname: bad\nfixed: {workload: nonsense}\n")
    with pytest.raises(ReproError):
        run(RunOptions(recipe=str(tmp_path / "bad.yaml"), run_id="r"))
    assert tracking_process._warm is None and _logging_processes(os.getpid()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no store, no runs/


def test_a_run_refused_for_its_recipe_or_untracked_by_it_never_starts_a_logging_process(tmp_path, monkeypatch):
    """MLflow's process is started once the recipe says the run logs: a refusal (the common case in
    a user's first tries) or an untracked recipe costs no MLflow import beside it."""
    from repro500.errors import ReproError
    from repro500.runner import RunOptions, run
    from repro500.tracking import process as tracking_process

    started = []
    monkeypatch.setattr(tracking_process, "ProcessTracker", lambda: started.append(1) or pytest.fail("started"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REPRO500_MLFLOW_PROCESS", raising=False)
    (tmp_path / "bad.yaml").write_text("schema: repro500/recipe/v1\nname: bad\nfixed: {workload: nonsense}\n")
    with pytest.raises(ReproError):
        run(RunOptions(recipe=str(tmp_path / "bad.yaml"), run_id="r"))
    outcome = run(RunOptions(adhoc=_command("print('Acc 0.9')"), run_id="u", tracking=False))
    assert outcome.exit_code == 0 and started == []


@pytest.mark.slow
def test_a_logging_process_that_dies_stops_the_run_after_the_repeat_in_flight(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from repro500.errors import InvalidInput
    from repro500.runner import RunOptions, run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REPRO500_MLFLOW_PROCESS", raising=False)
    uri = mlflow_store(tmp_path / "store.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # repeat 0 kills its sibling, the MLflow process (as the OOM killer would), once its run exists
    kill = textwrap.dedent("""
        import os, signal, pathlib, time
        ready = pathlib.Path(os.environ['REPRO500_MLFLOW_READY'])
        while not ready.exists():
            time.sleep(0.05)
        me = str(os.getppid())
        for p in pathlib.Path('/proc').iterdir():
            try:
                fields = dict(l.split(':\\t', 1) for l in (p / 'status').read_text().splitlines() if ':\\t' in l)
                cmd = (p / 'cmdline').read_bytes().split(b'\\0')
                if fields.get('PPid', '').strip() == me and b'repro500.tracking.process' in cmd:
                    os.kill(int(p.name), signal.SIGKILL)
                    # dead before the repeat ends (a zombie until the run reaps it): its leader shows as a
                    # zombie while its other threads still exit, and only then can the run see its status
                    while not all(s in (p / 'status').read_text() for s in ('State:\tZ', 'Threads:\t1\\n')):
                        time.sleep(0.01)
            except (OSError, ValueError):
                pass
        print('Acc 0.9')
    """)
    with pytest.raises(InvalidInput, match=r"logging to the MLflow tracking store .* failed "
                                           r"\(the MLflow logging process stopped \(exit -9\)\)"):
        run(RunOptions(adhoc=_command(kill, repeats=3), run_id="r"))
    meta = json.loads((tmp_path / "runs/r/run.json").read_text())
    assert meta["status"] == "failed" and not (tmp_path / "runs/r/repeats/1").exists()
    assert json.loads((tmp_path / "runs/r/repeats/0/summary.json").read_text())["status"] == "completed"
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    assert _logging_processes(os.getpid()) == []


def test_an_error_in_the_logging_process_comes_back_as_one_sentence(tmp_path, monkeypatch):
    from repro500.tracking.process import ProcessTracker, TrackingProcessError

    monkeypatch.chdir(tmp_path)
    tracker = ProcessTracker().connect("e", mlflow_store(tmp_path / "store.db"), None)
    try:
        assert tracker.experiment_id and tracker.notes == []
        with pytest.raises(TrackingProcessError, match="'Tracker' object has no attribute 'nosuch'"):
            tracker.nosuch()
        assert tracker.alive  # one failed call does not stop the process
    finally:
        tracker.close()
    assert not tracker.alive


def test_a_batch_systems_term_leaves_the_logging_to_the_run(tmp_path, monkeypatch):
    # SLURM signals every process of a job: the run closes what it logged through this process
    import signal
    import time

    from repro500.tracking.process import ProcessTracker, TrackingProcessError

    monkeypatch.chdir(tmp_path)
    tracker = ProcessTracker().connect("e", mlflow_store(tmp_path / "store.db"), None)
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(tracker.pid, sig)
        time.sleep(0.5)
        assert tracker.alive
        with pytest.raises(TrackingProcessError, match="no attribute 'nosuch'"):
            tracker.nosuch()  # still answering
    finally:
        tracker.close()
    assert not tracker.alive  # and it still stops when the run is done with it


@pytest.mark.slow
def test_ctrl_c_while_the_last_records_land_ends_the_parent_killed_not_running(tmp_path):
    # A real SIGINT reaches the run while it waits for the sealed run's upload, the parent's last record.
    script = textwrap.dedent(f"""
        import json, os, signal, sys, time
        from repro500.tracking import process as tracking_process
        from repro500.runner import RunOptions, run
        call = tracking_process.ProcessTracker._call
        def slow(self, name, *args, **kwargs):
            if name == "log_sealed":
                time.sleep(0.3)  # the run is waiting in Tracking.close by now
                os.kill(os.getpid(), signal.SIGINT)
            return call(self, name, *args, **kwargs)
        tracking_process.ProcessTracker._call = slow
        outcome = run(RunOptions(adhoc={_command("print('Acc 0.9')", repeats=1)!r}, run_id="r"))
        print(json.dumps({{"exit": outcome.exit_code}}))
    """)
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_store(tmp_path / "store.db"))
    env.pop("REPRO500_MLFLOW_PROCESS", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["exit"] == 130
    assert "Interrupted while MLflow's last records were written; the run is complete" in " ".join(done.stdout.split())
    from mlflow.tracking import MlflowClient

    meta = json.loads((tmp_path / "runs/r/run.json").read_text())
    assert meta["status"] == "completed"
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    assert client.get_run(meta["mlflow"]["parent_run_id"]).info.status == "KILLED"
    assert client.get_run(meta["mlflow"]["repeat_run_ids"]["0"]).info.status == "FINISHED"


def test_a_python_without_mlflow_is_told_before_anything_is_written(tmp_path, monkeypatch):
    import importlib.util

    from repro500.errors import InvalidInput
    from repro500.runner import RunOptions, run
    from repro500.tracking import process as tracking_process

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else found(name, *a))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    with pytest.raises(InvalidInput, match=r"MLflow is not installed in this Python \(.*\): pip install mlflow, "
                                           r"or run with --no-tracking"):
        run(RunOptions(adhoc=_command("print('Acc 0.9')"), run_id="r"))
    assert list(tmp_path.iterdir()) == [] and tracking_process._warm is None


@pytest.mark.slow
def test_a_resume_into_another_store_holds_every_repeat(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from repro500.errors import ReproError
    from repro500.runner import RunOptions, run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REPRO500_MLFLOW_PROCESS", raising=False)
    # repeat 1 fails the first time only: the first attempt finishes repeat 0 in store A
    count = tmp_path / "attempts"
    code = (f"import pathlib, sys; p = pathlib.Path({str(count)!r}); n = int(p.read_text()) if p.exists() else 0; "
            "p.write_text(str(n + 1)); print('Acc 0.%d' % (9 - n)); sys.exit(1 if n == 1 else 0)")
    first, second = mlflow_store(tmp_path / "a.db"), mlflow_store(tmp_path / "b.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", first)
    with pytest.raises(ReproError):
        run(RunOptions(adhoc=_command(code), run_id="r"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", second)  # the resume logs to another store
    assert run(RunOptions(resume="runs/r")).exit_code in (0, 3)  # 3: two spread values decide no band
    meta = json.loads((tmp_path / "runs/r/run.json").read_text())
    assert meta["mlflow"]["tracking_uri"] == second and sorted(meta["mlflow"]["repeat_run_ids"]) == ["0", "1"]
    client = MlflowClient(second)
    parent = client.get_run(meta["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED"
    repeats = {k: client.get_run(i) for k, i in meta["mlflow"]["repeat_run_ids"].items()}
    # repeat 0 came from the first attempt's files, with its metric, artifacts and parent
    assert repeats["0"].data.metrics["accuracy"] == pytest.approx(0.9) and repeats["1"].data.metrics["accuracy"] == \
        pytest.approx(0.7)
    assert all(r.info.status == "FINISHED" and r.data.tags["mlflow.parentRunId"] == parent.info.run_id
               for r in repeats.values())
    assert "summary.json" in [a.path for a in client.list_artifacts(repeats["0"].info.run_id)]
