"""The command workload: one repeat of a user's program as a subprocess (repro500.workloads.command.recipe)."""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.stores import mlflow_store

from repro500.capture.seeds import derive
from repro500.errors import InvalidInput
from repro500.workloads.command.process import group_alive
from repro500.workloads.command.recipe import CommandSpec, check, child_seed, declared_metrics, fill
from repro500.workloads.command.repeat import MlflowTarget, RepeatContext, run_repeat

PY = sys.executable
ACC = {"accuracy": {"regex": r"Acc@1 ([0-9.]+)", "scale": 0.01}}


def make(tmp_path: Path, code: str, *, metrics=None, args=(), mutable=None, **fixed) -> CommandSpec:
    (tmp_path / "child.py").write_text(textwrap.dedent(code))
    fixed = {"command": [PY, "child.py", *args], **fixed}
    return CommandSpec.from_recipe(fixed, metrics, mutable, source="r.yaml", base=tmp_path)


def run(spec, tmp_path, repeat=0, grace_s=None, **context):
    kw = {} if grace_s is None else {"grace_s": grace_s}
    return run_repeat(spec, repeat, derive(500, repeat), tmp_path / "repeats" / str(repeat), RepeatContext(**context), **kw)


# ----- recipe and placeholders ----------------------------------------------------------------
def test_placeholders_fill_every_argument(tmp_path):
    spec = CommandSpec.from_recipe(
        {"command": ["train", "--lr={mutable.lr}", "{mutable.opt.beta:.2f}", "{{literal}}", "{seed}",
                     "{repeat}", "{repeat_dir}/x", 3]},
        None, {"lr": 0.1, "opt": {"beta": 0.5}}, source="r.yaml", base=tmp_path)
    argv = fill(spec, seed=42, repeat=2, repeat_dir="/runs/r/repeats/2")
    assert argv == ["train", "--lr=0.1", "0.50", "{literal}", "42", "2", "/runs/r/repeats/2/x", "3"]


def test_a_whole_argument_list_placeholder_expands(tmp_path):
    spec = CommandSpec.from_recipe({"command": ["t", "--layers", "{mutable.layers}", "--n={mutable.n}"]},
                                   None, {"layers": [64, 32], "n": 2}, source="r", base=tmp_path)
    assert fill(spec, seed=1, repeat=0, repeat_dir="d") == ["t", "--layers", "64", "32", "--n=2"]
    with pytest.raises(InvalidInput, match="a list fills a whole argument only"):
        CommandSpec.from_recipe({"command": ["t", "--layers={mutable.layers}"]}, None, {"layers": [1]},
                                source="r", base=tmp_path)


@pytest.mark.parametrize(("command", "mutable", "needle"), [
    (["t", "{sed}"], {}, "unknown placeholder {sed} in '{sed}'"),
    (["t", "{}"], {}, "unknown placeholder {}"),
    (["t", "{mutable.lr}"], {"batch": 1}, "placeholder {mutable.lr} names no mutable value (mutable has: batch)"),
    (["t", "{mutable.opt}"], {"opt": {"beta": 1}}, "placeholder {mutable.opt} is not a single value"),
    (["t", "{seed"], {}, "is not a valid template"),
    (["t", "{seed!r}"], {}, "takes no conversion"),
    (["t", "{mutable.name:.2f}"], {"name": "adam"}, "cannot format 'adam'"),
])
def test_bad_placeholder_is_one_sentence_naming_fixed_command(tmp_path, command, mutable, needle):
    with pytest.raises(InvalidInput) as err:
        CommandSpec.from_recipe({"command": command}, None, mutable, source="r.yaml", base=tmp_path)
    assert str(err.value).startswith("r.yaml: fixed.command: ") and needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("fixed", "metrics", "needle"), [
    ({"command": []}, None, "fixed.command: expected a non-empty list"),
    ({"command": ["t", {"a": 1}]}, None, "argument 1 is a dict"),
    ({"command": ["t"], "timeout_s": 0}, None, "fixed.timeout_s: expected a positive number"),
    ({"command": ["t"], "outputs": ["/etc/passwd"]}, None, "must be relative"),
    ({"command": ["t"], "outputs": ["../x"]}, None, "must be relative"),
    ({"command": ["t"], "env": {"REPRO500_SEED": "1"}}, None, "fixed.env.REPRO500_SEED: is set by repro500"),
    ({"command": ["t"], "env": {"X": [1]}}, None, "fixed.env.X: expected a string or a number"),
    ({"command": ["t"]}, {"total_time_s": {}}, "total_time_s is measured by repro500"),
    ({"command": ["t"]}, {"acc": {"take": "median"}}, "r.yaml: metrics.acc: take must be one of"),
])
def test_bad_recipe_values(tmp_path, fixed, metrics, needle):
    with pytest.raises(InvalidInput) as err:
        CommandSpec.from_recipe(fixed, metrics, {}, source="r.yaml", base=tmp_path)
    assert needle in str(err.value)


def test_recipe_defaults_string_command_and_declared_names(tmp_path):
    spec = CommandSpec.from_recipe({"command": "python train.py --name 'a b'", "env": {"OMP_NUM_THREADS": 1},
                                    "workdir": "sub", "timeout_s": 5},
                                   {"accuracy": ACC["accuracy"], "loss": "mlflow"}, None, source="r", base=tmp_path)
    assert spec.argv == ["python", "train.py", "--name", "a b"]
    assert spec.workdir == (tmp_path / "sub").resolve() and spec.timeout_s == 5.0
    assert spec.env == {"OMP_NUM_THREADS": "1"}
    assert declared_metrics(spec) == ["accuracy", "loss"]


# ----- pre-flight -----------------------------------------------------------------------------
def test_check_finds_programs_on_path_and_relative_to_workdir(tmp_path):
    check(make(tmp_path, "pass"))
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    spec = CommandSpec.from_recipe({"command": ["./tool.sh"]}, None, None, source="r", base=tmp_path)
    with pytest.raises(InvalidInput, match=r"program ./tool.sh is not executable \(chmod \+x "):
        check(spec)
    tool.chmod(0o755)
    check(spec)


@pytest.mark.parametrize(("fixed", "needle"), [
    ({"command": ["no-such-program-xyz", "{seed}"]}, "r: fixed.command: program 'no-such-program-xyz' was not found on PATH"),
    ({"command": ["./missing.sh"]}, "program ./missing.sh was not found (looked in "),
    ({"command": ["python3", "trian.py"]}, "script trian.py was not found in "),
    ({"command": ["true"], "workdir": "nowhere"}, "fixed.workdir "),
])
def test_check_refuses_before_anything_runs(tmp_path, fixed, needle):
    spec = CommandSpec.from_recipe(fixed, None, None, source="r", base=tmp_path)
    with pytest.raises(InvalidInput) as err:
        check(spec)
    assert needle in str(err.value)


def test_check_mlflow_metric_without_tracking(tmp_path):
    spec = make(tmp_path, "pass", metrics={"loss": {"source": "mlflow"}})
    check(spec)
    with pytest.raises(InvalidInput, match="metrics.loss is read from MLflow, but this run is not tracked"):
        check(spec, tracking=False)


# ----- a completed repeat -----------------------------------------------------------------------
ENV_DUMP = """
    import json, os, sys
    import numpy
    numpy.random.seed(int(os.environ["REPRO500_SEED"]))  # a 64-bit seed would be refused here
    keys = ["REPRO500_SEED", "REPRO500_REPEAT", "REPRO500_REPEAT_DIR", "REPRO500_METRICS",
            "REPRO500_DETERMINISTIC", "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "MY_VAR", "PWD_SEEN"]
    env = {k: os.environ.get(k) for k in keys}
    env["argv"] = sys.argv[1:]
    env["cwd"] = os.getcwd()
    env["pgid_is_own"] = os.getpgid(0) == os.getpid()
    json.dump(env, open(os.path.join(os.environ["REPRO500_REPEAT_DIR"], "env.json"), "w"))
    print("Acc@1 91.0")
    print("progress", file=sys.stderr)
    print("Acc@1 93.5")
"""


def test_completed_repeat_env_streams_and_summary(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    spec = make(tmp_path, ENV_DUMP, metrics=ACC, args=["--seed", "{seed}", "--dir", "{repeat_dir}"],
                env={"MY_VAR": "x"})
    check(spec)
    lines = []
    summary = run(spec, tmp_path, repeat=1, echo=lambda stream, line: lines.append((stream, line)))
    out = tmp_path / "repeats" / "1"
    seeds = derive(500, 1)
    env = json.loads((out / "env.json").read_text())
    assert env["REPRO500_SEED"] == str(child_seed(seeds)) == env["argv"][1] and child_seed(seeds) < 2**32
    assert env["argv"][3] == env["REPRO500_REPEAT_DIR"] == str(out.resolve())
    assert env["REPRO500_METRICS"] == str(out.resolve() / "metrics.json")
    assert env["REPRO500_REPEAT"] == "1" and env["MY_VAR"] == "x" and env["cwd"] == str(tmp_path.resolve())
    assert env["PYTHONHASHSEED"] == str(seeds.python % 2**32)
    assert env["REPRO500_DETERMINISTIC"] == "0" and env["CUBLAS_WORKSPACE_CONFIG"] is None
    assert env["pgid_is_own"] is True
    assert ("stdout", "Acc@1 93.5") in lines and ("stderr", "progress") in lines
    assert [line for stream, line in lines if stream == "stdout"] == ["Acc@1 91.0", "Acc@1 93.5"]
    assert (out / "stdout.txt").read_text() == "Acc@1 91.0\nAcc@1 93.5\n"
    assert (out / "stderr.txt").read_text() == "progress\n"
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["exit_status"] == 0 and summary["signal"] is None and summary["timed_out"] is False
    assert summary["metrics"]["accuracy"] == pytest.approx(0.935)
    assert summary["metric_sources"] == {"accuracy": "regex:stdout"}
    assert summary["metrics"]["total_time_s"] == summary["total_time_s"] > 0
    assert summary["seeds"] == seeds.as_dict() and summary["engine"] == "command" and summary["world_size"] == 1
    assert summary["schema"] == "repro500/repeat-summary/v1" and summary["final_param_digest"] is None
    assert json.loads((out / "summary.json").read_text()) == summary


def test_deterministic_exports(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    spec = make(tmp_path, ENV_DUMP)
    run(spec, tmp_path, deterministic=True)
    env = json.loads((tmp_path / "repeats/0/env.json").read_text())
    assert env["REPRO500_DETERMINISTIC"] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_outputs_are_hashed_and_json_digest_wins(tmp_path):
    code = """
        import json, os, sys
        open(os.path.join(os.environ["REPRO500_REPEAT_DIR"], "model.pt"), "wb").write(b"weights")
        open("vocab.txt", "w").write("a b")
        print("loss 0.5")
        if sys.argv[1:] == ["digest"]:
            json.dump({"param_digest": "cafe"}, open(os.environ["REPRO500_METRICS"], "w"))
    """
    spec = make(tmp_path, code, outputs=["model.pt", "vocab.txt"])
    summary = run(spec, tmp_path)
    sha = {"model.pt": hashlib.sha256(b"weights").hexdigest(), "vocab.txt": hashlib.sha256(b"a b").hexdigest()}
    assert summary["outputs"] == sha
    lines = "".join(f"{v}  {k}\n" for k, v in sorted(sha.items()))  # as sha256sum writes them
    assert summary["final_param_digest"] == hashlib.sha256(lines.encode()).hexdigest()
    assert run(make(tmp_path, code, args=["digest"], outputs=["model.pt"]), tmp_path)["final_param_digest"] == "cafe"
    missing = run(make(tmp_path, code, outputs=["ckpt.pt"], metrics={"loss": {"regex": "loss ([0-9.]+)"}}), tmp_path)
    assert missing["status"] == "failed" and "declared output ckpt.pt was not written" in missing["error"]
    assert missing["metrics"] == {"total_time_s": missing["total_time_s"]} and missing["metric_sources"] == {}


def test_a_resumed_repeat_does_not_read_an_earlier_attempts_metrics(tmp_path):
    out = tmp_path / "repeats" / "0"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text('{"f1": 0.9}')
    summary = run(make(tmp_path, "pass", metrics={"f1": {"source": "json"}}), tmp_path)
    assert summary["status"] == "failed" and "was not written" in summary["error"]


# ----- failures: one sentence each, the repeat recorded --------------------------------------------
@pytest.mark.parametrize(("code", "metrics", "needle"), [
    ("print('Acc@5 99')", ACC, "metric accuracy: no line of stdout matched regex 'Acc@1 ([0-9.]+)'"),
    ("print('Acc@1 nan')", {"accuracy": {"regex": r"Acc@1 (\S+)"}}, "metric accuracy is nan (regex:stdout)"),
    ("print('Acc@1 90')", {**ACC, "f1": {"source": "json"}}, "metric f1: $REPRO500_METRICS ("),
    ("print('Acc@1 inf')", {"accuracy": {"regex": r"Acc@1 (\S+)"}}, "metric accuracy is inf (regex:stdout)"),
    ("pass", {"f1": {"source": "json"}}, "$REPRO500_METRICS ("),
    ("import sys; print('boom: bad shape', file=sys.stderr); sys.exit(3)", ACC,
     "the command exited with status 3: boom: bad shape"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", ACC, "the command was killed by SIGKILL"),
])
def test_failed_repeats(tmp_path, code, metrics, needle):
    summary = run(make(tmp_path, code, metrics=metrics), tmp_path)
    assert summary["status"] == "failed"
    assert needle in summary["error"] and "\n" not in summary["error"]
    assert set(summary["metrics"]) == {"total_time_s"}
    assert json.loads((tmp_path / "repeats/0/summary.json").read_text())["status"] == "failed"


def test_exit_and_signal_recorded(tmp_path):
    summary = run(make(tmp_path, "import sys; sys.exit(3)"), tmp_path)
    assert (summary["exit_status"], summary["signal"]) == (3, None)
    summary = run(make(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), tmp_path)
    assert (summary["exit_status"], summary["signal"]) == (None, "SIGSEGV")


def test_a_repeats_time_starts_before_its_child_is_launched(tmp_path, monkeypatch):
    # A parent descheduled right after the launch (a loaded machine) must not lose the child's
    # first part: here the child sleeps a known time before doing anything and is done before
    # the parent runs again. Timed from after the launch, the repeat took ~0 s.
    from repro500.workloads.command import process

    launch = process.subprocess.Popen
    child_sleep_s, parent_pause_s = 0.4, 0.8

    def launch_then_pause(*args, **kwargs):
        proc = launch(*args, **kwargs)
        time.sleep(parent_pause_s)
        return proc

    monkeypatch.setattr(process.subprocess, "Popen", launch_then_pause)
    spec = make(tmp_path, f"import time; time.sleep({child_sleep_s}); print('Acc@1 90')", metrics=ACC)
    summary = run(spec, tmp_path)
    assert summary["status"] == "completed", summary["error"]
    assert summary["total_time_s"] >= parent_pause_s > child_sleep_s


def test_program_not_found_at_run_time(tmp_path):
    spec = CommandSpec.from_recipe({"command": ["no-such-program-xyz"]}, None, None, source="r", base=tmp_path)
    summary = run(spec, tmp_path)
    assert summary["status"] == "failed" and "program no-such-program-xyz was not found" in summary["error"]


def test_secrets_are_scrubbed_from_command_and_error_but_not_from_the_users_output(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3cr3t-value-42")
    token = "ghp_" + "a1B2" * 9
    code = "import os, sys; print('auth failed for', os.environ['MY_SERVICE_TOKEN'], file=sys.stderr); sys.exit(2)"
    spec = make(tmp_path, code, args=["--password", "hunter22", f"--api-key={token}", "--user", "bob",
                                      "https://bob:pw1234@example.org/x", "s3cr3t-value-42"])
    summary = run(spec, tmp_path)
    assert summary["command"][2:] == ["--password", "[REDACTED]", "--api-key=[REDACTED]", "--user", "bob",
                                      "https://[REDACTED]@example.org/x", "[REDACTED]"]
    assert "s3cr3t" not in summary["error"] and "[REDACTED]" in summary["error"]
    written = (tmp_path / "repeats/0/summary.json").read_text()
    assert "s3cr3t" not in written and "hunter22" not in written and token not in written
    assert "s3cr3t-value-42" in (tmp_path / "repeats/0/stderr.txt").read_text()  # the user's own output


# ----- timeout and interruption: the whole group goes ---------------------------------------------
SLEEPER = """
    import os, signal, subprocess, sys, time
    if "--stubborn" in sys.argv:  # first: a timeout on a slow machine may come early
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open("pids.txt", "w").write(f"{os.getpgid(0)} {grandchild.pid}")
    if "--on-int" in sys.argv:
        def on_int(*_):
            open("got.txt", "w").write("SIGINT")
            sys.exit(130)
        signal.signal(signal.SIGINT, on_int)
    print("ready", flush=True)
    time.sleep(60)
"""


def _pids(tmp_path):
    return [int(x) for x in (tmp_path / "pids.txt").read_text().split()]


@pytest.mark.parametrize("stubborn", [False, True])
def test_timeout_stops_the_whole_process_group(tmp_path, stubborn):
    spec = make(tmp_path, SLEEPER, args=["--stubborn"] if stubborn else [], timeout_s=2)
    started = time.monotonic()
    summary = run(spec, tmp_path, grace_s=1.0)
    # 2 s timeout + 1 s grace; a run that did not stop the group would wait out the sleepers' 60 s:
    # 30 s tells the two apart with room for a loaded machine's process starts
    assert time.monotonic() - started < 30
    pgid, grandchild = _pids(tmp_path)
    assert not group_alive(pgid)  # the grandchild shares the group
    assert summary["status"] == "failed" and summary["timed_out"] is True
    assert "exceeded fixed.timeout_s = 2 s" in summary["error"]
    assert summary["signal"] == ("SIGKILL" if stubborn else "SIGTERM")


def test_what_a_finished_child_left_running_in_its_group_is_stopped(tmp_path):
    code = """
        import os, subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open("pids.txt", "w").write(f"{os.getpgid(0)} {p.pid}")
    """
    summary = run(make(tmp_path, code), tmp_path)
    pgid, _ = _pids(tmp_path)
    assert summary["status"] == "completed" and not group_alive(pgid)


def _interrupt_main_when_ready(tmp_path, sig):
    main = threading.main_thread().ident

    def fire():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stdout = tmp_path / "repeats/0/stdout.txt"
            if stdout.exists() and "ready" in stdout.read_text():
                signal.pthread_kill(main, sig)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_is_forwarded_and_recorded_as_killed(tmp_path, sig):
    def to_keyboard_interrupt(*_):  # what the runner does with SIGTERM
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, to_keyboard_interrupt)
    try:
        spec = make(tmp_path, SLEEPER, args=["--on-int"])
        _interrupt_main_when_ready(tmp_path, sig)
        with pytest.raises(KeyboardInterrupt):
            run(spec, tmp_path, grace_s=5.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "got.txt").read_text() == "SIGINT"  # the child saw Ctrl-C, not a kill
    pgid, _ = _pids(tmp_path)
    assert not group_alive(pgid)
    summary = json.loads((tmp_path / "repeats/0/summary.json").read_text())
    assert summary["status"] == "killed" and summary["exit_status"] == 130 and "interrupted" in summary["error"]


# ----- the script's own MLflow runs, found by the tags repro500's run-context provider puts on them ------
# The script keeps its MLflow habits unmodified: its own experiment, named runs, several runs, autologging.
SCRIPT_WITH_MLFLOW_HABITS = """
    import mlflow
    mlflow.set_experiment("my-own-experiment")
    mlflow.autolog(silent=True)
    with mlflow.start_run(run_name="train"):
        mlflow.log_metric("loss", 0.9, step=0)
        mlflow.log_metric("loss", 0.25, step=1)
    with mlflow.start_run(run_name="evaluate"):
        mlflow.log_metric("accuracy", 0.93)
"""


@pytest.mark.slow
def test_a_scripts_own_mlflow_runs_are_tagged_and_its_metrics_read_back(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("MLFLOW_RUN_ID", "f" * 32)  # a leftover in the user's shell: never handed on
    uri = mlflow_store(tmp_path / "mlflow.db")
    MlflowClient(uri).search_experiments()  # the store exists, as the runner's background thread makes it
    spec = make(tmp_path, SCRIPT_WITH_MLFLOW_HABITS,
                metrics={"accuracy": "mlflow", "loss": {"source": "mlflow"}, "worst_loss": {"key": "loss", "take": "max"}})
    summary = run(spec, tmp_path, repeat=2, run_id="r-1", mlflow=MlflowTarget(uri, "repro500/t"))
    assert summary["status"] == "completed", summary["error"]
    assert summary["metrics"]["accuracy"] == 0.93 and summary["metrics"]["loss"] == 0.25
    assert summary["metrics"]["worst_loss"] == 0.9
    assert summary["metric_sources"] == {"accuracy": "mlflow", "loss": "mlflow", "worst_loss": "mlflow"}
    client = MlflowClient(uri)
    mine = client.get_experiment_by_name("my-own-experiment")
    runs = {r.info.run_name: r.data.tags for r in client.search_runs([mine.experiment_id])}
    assert set(runs) == {"train", "evaluate"}
    for tags in runs.values():
        assert tags["repro500.run_id"] == "r-1" and tags["repro500.repeat"] == "2" and tags["repro500.script"] == "true"


def test_a_script_without_a_run_of_its_own_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = make(tmp_path, "print('no mlflow here')", metrics={"loss": "mlflow"})
    summary = run(spec, tmp_path, run_id="r-2", mlflow=MlflowTarget(uri, "repro500/t"))
    assert summary["status"] == "failed"
    assert summary["error"].startswith("metric loss: the script started no MLflow run in this repeat")


def test_metrics_from_mlperf_logging_and_the_json_file(tmp_path):
    code = """
        import json, os
        from mlperf_logging import mllog
        logger = mllog.get_mllogger()
        for epoch, acc in enumerate([0.61, 0.74], start=1):
            logger.event(key=mllog.constants.EVAL_ACCURACY, value=acc, metadata={"epoch_num": epoch})
        json.dump({"scores": {"f1": 0.5}, "top5": 0.9}, open(os.environ["REPRO500_METRICS"], "w"))
    """
    metrics = {"accuracy": {"source": "mllog", "key": "eval_accuracy"},
               "first_accuracy": {"source": "mllog", "key": "eval_accuracy", "take": "first"},
               "f1": {"source": "json", "key": "scores.f1"}, "top5": {}}
    summary = run(make(tmp_path, code, metrics=metrics), tmp_path)
    assert summary["status"] == "completed", summary["error"]
    assert {k: summary["metrics"][k] for k in metrics} == {"accuracy": 0.74, "first_accuracy": 0.61, "f1": 0.5, "top5": 0.9}
    assert summary["metric_sources"] == {"accuracy": "mllog", "first_accuracy": "mllog", "f1": "json", "top5": "json"}


def test_an_unwritable_repeat_directory_is_one_sentence(tmp_path):
    spec = make(tmp_path, "print('never runs')")
    with pytest.raises(InvalidInput, match=r"^the repeat directory /dev/null/repeats/0 cannot be written \("):
        run_repeat(spec, 0, derive(500, 0), Path("/dev/null/repeats/0"))


def test_mlflow_metrics_are_refused_under_no_tracking(tmp_path):
    spec = make(tmp_path, "pass", metrics={"loss": "mlflow"})
    with pytest.raises(InvalidInput, match="not tracked"):  # an untracked run refuses them for its own reason
        check(spec, tracking=False)


# What MLflow loads in the command (provider_check.py): broken shadows are refused end to end in
# tests/test_as_it_is.py; here, which Python and which first sys.path entry are asked, and when a
# remembered success no longer holds.
def test_the_python_asked_is_the_commands_own(tmp_path):
    from repro500.workloads.command.provider_check import first_path, interpreter

    script = tmp_path / "train.py"
    script.write_text(f"#!/usr/bin/env {Path(PY).name}\nprint(1)\n")
    torchrun = Path(PY).parent / "torchrun"
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/sh\npython train.py\n")
    env = {"PATH": str(Path(PY).parent)}
    assert interpreter([PY, "train.py"], PY, env) == PY
    assert interpreter(["./train.py"], str(script), env) == str(Path(PY).parent / Path(PY).name)
    assert Path(interpreter([str(torchrun)], str(torchrun), env)).parent == Path(PY).parent  # a console script
    assert interpreter(["./run.sh"], str(shell), env) == sys.executable  # unknown: repro500's own
    sub = tmp_path / "sub"
    assert first_path([PY, "-W", "always", "sub/train.py"], tmp_path) == sub
    assert first_path([PY, "-u", "-m", "pkg.train"], tmp_path) == tmp_path
    assert first_path(["./train.py"], tmp_path) == tmp_path


def test_a_remembered_check_no_longer_holds_once_a_module_it_loaded_is_shadowed(tmp_path):
    from repro500.workloads.command.provider_check import shadows

    modules = ["mlflow", "repro500", "yaml"]
    before = shadows(modules, tmp_path, tmp_path, {})
    (tmp_path / "runs").mkdir()  # what a run writes beside the script changes nothing
    (tmp_path / "data.csv").write_text("1\n")
    assert shadows(modules, tmp_path, tmp_path, {}) == before
    (tmp_path / "yaml.py").write_text("x = 1\n")  # MLflow would import this one in the command
    assert shadows(modules, tmp_path, tmp_path, {}) != before
    (tmp_path / "yaml.py").unlink()
    (tmp_path / "lib" / "repro500").mkdir(parents=True)
    assert shadows(modules, tmp_path, tmp_path, {"PYTHONPATH": "lib"}) != before


# Saves its step in $REPRO500_CHECKPOINT_DIR after each one and continues from there; its first
# attempt waits at step 2 (for the Ctrl-C) until "go" exists.
CHECKPOINTING = """\
import json, os, time
saved = os.path.join(os.environ["REPRO500_CHECKPOINT_DIR"], "step.json")
step = json.load(open(saved))["step"] if os.path.exists(saved) else 0
print("starting at step", step)
while step < 5:
    step += 1
    json.dump({"step": step}, open(saved, "w"))
    while step == 2 and not os.path.exists("go"):
        time.sleep(0.05)
print("score 0.5")
"""


def test_a_repeat_run_again_continues_from_the_state_its_command_saved(tmp_path):
    from helpers.runs import interrupt_once_started, repro500, tool_env

    (tmp_path / "work.py").write_text(CHECKPOINTING)
    run = tmp_path / "runs" / "ck"
    code, out, err = interrupt_once_started(["--run-id", "ck", "--repeats", "2", "--no-tracking", "--command",
                                             "--metric", "score=regex:score ([0-9.]+)", "--accept", "score>=0.4", "--",
                                             PY, "work.py"], cwd=tmp_path, env=tool_env(), run=run, repeats=(0,))
    assert code == 130, out + err
    first = json.loads((run / "repeats/0/summary.json").read_text())
    assert first["status"] == "killed", (first, out, err)
    assert json.loads((run / "repeats/0/checkpoint/step.json").read_text()) == {"step": 2}

    standing = repro500("status", "runs/ck", cwd=tmp_path)
    assert standing.returncode == 0 and standing.stdout.splitlines() == [
        "run ck (runs/ck): interrupted", "  repeat 0: killed", "  repeat 1: not run",
        "complete the run with: repro500 run --resume runs/ck"], standing.stdout + standing.stderr

    (tmp_path / "go").write_text("")
    resumed = repro500("run", "--resume", "runs/ck", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summaries = [json.loads((run / f"repeats/{k}/summary.json").read_text()) for k in (0, 1)]
    assert (run / "repeats/0/stdout.txt").read_text().startswith("starting at step 2")  # not from the beginning
    assert (run / "repeats/1/stdout.txt").read_text().startswith("starting at step 0")
    assert summaries[0]["checkpoint"]["continued"] and summaries[0]["checkpoint"]["files"] == 1
    assert "checkpoint" not in summaries[1]  # it ran once: nothing to continue from
    checked = repro500("verify", "runs/ck", cwd=tmp_path)
    said = " ".join(checked.stdout.split())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "repeat(s) 0 continued from the state their command saved in an earlier, interrupted attempt" in said
    assert repro500("status", "runs/ck", cwd=tmp_path).stdout.splitlines()[-1] == "verify it with: repro500 verify runs/ck"
