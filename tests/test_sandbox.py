"""A publication's code runs in bubblewrap under ``reproduce --run-code``: a command that tries, each in
its own repeat, to read the reproducer's secrets (a file under HOME, a variable of the environment),
to write beside the publication and in HOME, to reach a port on 127.0.0.1 and to leave a process
behind gets none of it, and its rerun still completes to a verdict; ``--network`` grants the
connection; ``--no-sandbox`` grants everything, and the manifest and the verdict say so.

These tests need bwrap (the ``bubblewrap`` package, which .ci/run installs): they never skip."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.runs import repro500, write_recipe

from repro500 import sandbox

SECRET_ENV = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSANDBOXPROBE"
SECRET_FILE = "aws_secret_access_key = HOMEFILE-9f8e7d6c5b4a-SANDBOXPROBE"
REPEATS = 6

# The experiment behaves on the publisher's machine; run from a reproduction's OUT/source, repeat k
# tries attack k (0: none).  Every repeat prints its metric whatever its attack found.
PROBE = '''
import os, random, socket, subprocess, sys, time
from pathlib import Path

k = int(os.environ["REPRO500_REPEAT"])
random.seed(int(os.environ["REPRO500_SEED"]))
print(f"Acc@1 {90 + random.random() / 20:.4f}", flush=True)
if Path.cwd().name != "source":
    sys.exit(0)

def attempt(what, action):
    try:
        print(f"{what}: GOT {action()}", flush=True)
    except Exception as err:
        print(f"{what}: denied ({type(err).__name__})", flush=True)

if k == 1:
    attempt("home file", lambda: Path(HOME, ".aws", "credentials").read_text())
    # OUT/source/../../home: the reproducer's files by way of ".." from the code's own directory
    attempt("home by ..", lambda: Path("..", "..", "home", ".aws", "credentials").read_text())
if k == 2:
    attempt("environment", lambda: os.environ["AWS_SECRET_ACCESS_KEY"])
if k == 3:
    attempt("beside the publication", lambda: Path(PUB, "planted.txt").write_text("x"))
    attempt("in HOME", lambda: Path(HOME, "planted.txt").write_text("x"))
    # links planted in OUT, for repro500 to follow once the sandbox is gone (one inside the rerun's own
    # directory makes it unsealable: exit 4, a case of its own)
    out = os.path.join(os.environ["REPRO500_REPEAT_DIR"], "..", "..", "..", "..")
    os.symlink(os.path.join(HOME, ".aws", "credentials"), os.path.join(out, "creds"))
    os.symlink(os.path.join(HOME, ".aws"), os.path.join(out, "runs", "rerun-zzz"))
if k == 4:
    def connect():
        with socket.create_connection(("127.0.0.1", PORT), timeout=3) as s:
            s.sendall(b"hello")
        return "connected"
    attempt("listener", connect)
if k == 5:
    loop = ("import os, sys, time\\n"
            "open(sys.argv[1] + '.pid', 'w').write(str(os.getpid()))\\n"
            "while True:\\n"
            "    open(sys.argv[1], 'w').write(str(time.time()))\\n"
            "    time.sleep(0.2)\\n")
    beat = os.path.join(os.environ["REPRO500_REPEAT_DIR"], "..", "..", "..", "..", "heartbeat")
    subprocess.Popen([sys.executable, "-c", loop, os.path.abspath(beat)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("background process started", flush=True)
'''


class Listener:
    """A TCP port on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join(timeout=2)
        self.sock.close()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(the test's directory, the publication) of the probe experiment, run on the 'publisher's' side."""
    root = tmp_path_factory.mktemp("sandbox")
    home, lab, listener = root / "home", root / "lab", Listener()
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(SECRET_FILE)
    lab.mkdir()
    script = f"HOME = {str(home)!r}\nPUB = {str(root / 'pub')!r}\nPORT = {listener.port}\n" + textwrap.dedent(PROBE)
    (lab / "probe.py").write_text(script)
    write_recipe(lab / "exp.yaml", {
        "schema": "repro500/recipe/v1", "name": "probe",
        "fixed": {"command": [sys.executable, "probe.py"]},
        "metrics": {"accuracy": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}},
        "acceptance": {"accuracy": {"target": 0.9, "tolerance": 0.005}}, "repeats": REPEATS, "seed": 11})
    ran = repro500("run", "exp.yaml", "--no-tracking", "--run-id", "orig", cwd=lab)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    done = repro500("publish", str(lab / "runs" / "orig"), "--out", str(root / "pub"), cwd=root)
    assert done.returncode == 0, done.stderr
    yield root, listener
    listener.close()


def _reproduce(root: Path, out: str, *flags: str, env: dict | None = None):
    env = {"HOME": str(root / "home"), "AWS_SECRET_ACCESS_KEY": SECRET_ENV, **(env or {})}
    return repro500("reproduce", "pub", "--out", out, "--run-code", *flags, cwd=root, env=env, timeout=600)


def _everything_in(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _rerun(out: Path) -> Path:
    return next(p for p in (out / "runs").iterdir() if not p.is_symlink())


def _said(out: Path, k: int) -> str:
    return (_rerun(out) / "repeats" / str(k) / "stdout.txt").read_text()


def _beating(beat: Path) -> bool:
    if not beat.exists():
        return False
    first = beat.read_text()
    time.sleep(1.0)
    return beat.read_text() != first


@pytest.mark.slow
def test_the_sandbox_denies_each_attempt_and_the_rerun_still_reaches_its_verdict(published):
    root, listener = published
    before = listener.accepted
    done = _reproduce(root, "boxed")
    assert done.returncode == 0, done.stdout + done.stderr
    out = root / "boxed"
    assert "sandbox: bubblewrap" in done.stdout and "no network" in done.stdout  # the plan line
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["status"] == "REPRODUCED"
    rerun = _rerun(out)
    summaries = [json.loads((rerun / "repeats" / str(k) / "summary.json").read_text()) for k in range(REPEATS)]
    assert [s["status"] for s in summaries] == ["completed"] * REPEATS
    assert "home file: denied" in _said(out, 1) and "home by ..: denied" in _said(out, 1)
    assert "environment: denied (KeyError)" in _said(out, 2)
    assert "beside the publication: denied" in _said(out, 3) and "in HOME: denied" in _said(out, 3)
    assert not (root / "pub" / "planted.txt").exists() and not (root / "home" / "planted.txt").exists()
    assert "listener: denied" in _said(out, 4) and listener.accepted == before
    assert "background process started" in _said(out, 5)
    assert not _beating(out / "heartbeat"), "a process of the rerun outlived it"
    everything = _everything_in(out)
    assert SECRET_ENV not in everything and "HOMEFILE-9f8e7d6c5b4a" not in everything
    assert (out / "creds").is_symlink() and Path(verdict["run_dir"]).name == rerun.name  # planted, not followed
    manifest = json.loads((rerun / "manifest.json").read_text())
    record = manifest["facets"]["sandbox"]
    assert record["sandboxed"] is True and record["network"] is False
    assert str((out / "source").resolve()) in record["read_only"] and str(out.resolve()) in record["writable"]
    assert "AWS_SECRET_ACCESS_KEY" not in record["environment"] and "HOME" in record["environment"]
    assert verdict["sandbox"]["sandboxed"] is True


def test_network_grants_the_connection(published):
    root, listener = published
    before = listener.accepted
    done = _reproduce(root, "networked", "--network")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "with the network (--network)" in done.stdout
    assert "listener: GOT connected" in _said(root / "networked", 4)
    assert listener.accepted == before + 1
    assert "home file: denied" in _said(root / "networked", 1)  # the network, nothing else


@pytest.mark.slow
def test_no_sandbox_grants_everything_and_the_records_say_so(published):
    root, listener = published
    before = listener.accepted
    # bwrap missing does not matter once the reproducer chose to run the code unconfined
    done = _reproduce(root, "open", "--no-sandbox", env={sandbox.BWRAP_ENV: str(root / "no-bwrap")})
    out = root / "open"
    beat = out / "heartbeat"
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "WITHOUT the sandbox (--no-sandbox)" in done.stdout
        assert "HOMEFILE-9f8e7d6c5b4a" in _said(out, 1)
        assert f"environment: GOT {SECRET_ENV}" in _said(out, 2)
        assert (root / "pub" / "planted.txt").exists() and (root / "home" / "planted.txt").exists()
        assert "listener: GOT connected" in _said(out, 4) and listener.accepted == before + 1
        assert _beating(beat), "the background process should outlive an unconfined rerun"
        record = json.loads((_rerun(out) / "manifest.json").read_text())["facets"]["sandbox"]
        assert record == {"sandboxed": False, "consent": "--no-sandbox"}
        verdict = json.loads((out / "verdict.json").read_text())
        assert verdict["sandbox"] == record and verdict["status"] == "REPRODUCED"  # the sandboxed rerun's verdict
    finally:
        pid = Path(f"{beat}.pid")
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGTERM)
        (root / "pub" / "planted.txt").unlink(missing_ok=True)


def test_without_bwrap_run_code_is_refused_naming_the_package(published):
    root, _ = published
    done = _reproduce(root, "nobwrap", env={sandbox.BWRAP_ENV: str(root / "no-bwrap")})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "install the bubblewrap package" in done.stderr and "--no-sandbox" in done.stderr
    assert "Traceback" not in done.stderr and not (root / "nobwrap").exists()


@pytest.mark.parametrize("flags", [("--network",), ("--no-sandbox",), ("--sandbox-ro", ".")])
def test_sandbox_options_need_run_code(published, flags):
    root, _ = published
    done = repro500("reproduce", "pub", "--out", "usage", *flags, cwd=root)
    assert done.returncode == 2, done.stderr
    assert "--run-code" in done.stderr and not (root / "usage").exists()


def test_the_environment_that_reaches_sandboxed_code():
    kept = sandbox.environment({
        "PATH": "/usr/bin", "LC_ALL": "C", "REPRO500_SEED": "1", "AWS_SECRET_ACCESS_KEY": "x" * 20,
        "GITHUB_TOKEN": "ghp_x", "REPRO500_SIGNING_KEY": "/root/.ssh/k", "REPRO500_SIGNING_KEY_PASSPHRASE": "p",
        "MLFLOW_TRACKING_URI": "https://alice:hunter22@mlflow.example.org", "MLFLOW_EXPERIMENT_NAME": "e",
        "SSH_AUTH_SOCK": "/run/ssh", "HOME": "/root", "OMP_NUM_THREADS": "2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NCCL_ALGO": "Ring", "EDITOR": "vi", "HF_TOKEN": "hf_x"})
    # what the manifest records as choosing kernels passes (the rerun runs as it would unconfined)
    assert kept == {"PATH": "/usr/bin", "LC_ALL": "C", "REPRO500_SEED": "1", "MLFLOW_EXPERIMENT_NAME": "e",
                    "OMP_NUM_THREADS": "2", "ONEDNN_MAX_CPU_ISA": "AVX2", "NCCL_ALGO": "Ring"}


def test_wrapped_code_sees_no_secret_of_etc_and_no_home(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "beside.txt").write_text("not granted")
    grants = sandbox.Grants(write=(out,))
    argv = sandbox.wrap(grants, {"PATH": os.environ["PATH"]}, cwd=out)
    import subprocess

    probe = ("import os, pathlib\n"
             "def shadow():\n"
             "    try:\n"
             "        return len(pathlib.Path('/etc/shadow').read_text())\n"
             "    except OSError:\n"
             "        return 0\n"
             "print(os.environ['HOME'], sorted(os.listdir(os.environ['HOME'])), shadow(), "
             "os.path.exists(os.path.expanduser('~root/.ssh')), sorted(os.listdir(os.path.dirname(os.getcwd()))))")
    done = subprocess.run([*argv, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    # /etc is there (programs need it), its secrets are not; the reproducer's home is not there at all
    assert done.stdout.split() == [sandbox.HOME, "[]", "0", "False", "['out']"]


def test_a_scratch_grant_takes_the_writes_and_the_checked_tree_stays_as_it_was(tmp_path):
    """A build backend writes beside the sources it builds (setuptools' egg-info): the installs of
    --env venv see OUT/source through a copy that takes the writes."""
    import subprocess

    out, source, copy = tmp_path / "out", tmp_path / "out" / "source", tmp_path / "copy"
    source.mkdir(parents=True)
    (source / "mod.py").write_text("x = 1\n")
    copy.mkdir()
    (copy / "mod.py").write_text("x = 1\n")
    # OUT writable, OUT/source read-only, as the rerun has them; the scratch copy wins over both
    grants = sandbox.Grants(read=(source,), write=(out,), scratch=((source, copy),))
    argv = sandbox.wrap(grants, {"PATH": os.environ["PATH"]}, cwd=source)
    probe = "import pathlib; pathlib.Path('pkg.egg-info').mkdir(); print(pathlib.Path('mod.py').read_text().strip())"
    done = subprocess.run([*argv, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "x = 1"
    assert (copy / "pkg.egg-info").is_dir() and sorted(p.name for p in source.iterdir()) == ["mod.py"]
    assert any("throwaway copy" in w for w in sandbox.record(grants, {})["writable"])


@pytest.mark.slow  # four replays, a minute under load, as the unconfined locate test in test_consent.py
def test_a_consented_replay_in_locate_runs_confined(tmp_path):
    """A packed run's plug-in, imported by locate's replays with --run-code, reads and writes nothing of
    the reproducer's; the replays still answer, and the answer says they were sandboxed."""
    import yaml
    from helpers.runs import PLUGIN

    home, lab = tmp_path / "home", tmp_path / "lab"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(SECRET_FILE)
    lab.mkdir()
    attempt = (f"import pathlib\ntry:\n    pathlib.Path({str(tmp_path / 'MARKER')!r}).write_text("
               f"pathlib.Path({str(home / '.aws' / 'credentials')!r}).read_text())\nexcept OSError:\n    pass\n")
    # the publisher's own run writes the marker too: only the replays' attempt is the test's
    (lab / "evilmod.py").write_text(attempt + PLUGIN)
    recipe = {"schema": "repro500/recipe/v1", "name": "evil",
              "fixed": {"workload": "classification", "model": "evilmod:build", "model_options": {"width": 8},
                        "dataset": {"entry": "evilmod:make", "params": {"samples": 32, "seed": 1}},
                        "target": {"metric": "accuracy", "value": 0.999}, "epochs": 1},
              "mutable": {"batch_size": 16, "eval_batch_size": 32, "optimizer": {"name": "sgd", "lr": 0.1},
                          "threads": 1},
              "acceptance": {"accuracy": {"target": 0.5, "tolerance": 0.5}}, "repeats": 2, "seed": 5}
    (lab / "evil.yaml").write_text(yaml.safe_dump(recipe))
    ran = repro500("run", "evil.yaml", "--same-seed", "--no-tracking", "--run-id", "r", cwd=lab)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    assert repro500("pack", "runs/r", "-o", str(tmp_path / "r.tar.gz"), cwd=lab).returncode == 0
    (tmp_path / "MARKER").unlink()
    done = repro500("locate", str(tmp_path / "r.tar.gz"), "--steps", "1", "--run-code", "--json", cwd=tmp_path,
                    env={"HOME": str(home)})
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert not (tmp_path / "MARKER").exists()
    assert answer["sandbox"]["A"]["sandboxed"] is True and answer["sandbox"]["A"]["network"] is False
    assert "replay of A: sandbox: bubblewrap" in done.stderr


OWN = '''
import os, pathlib, socket, sys
print("Acc@1 91.0")
try:
    print("home:", pathlib.Path(sys.argv[1]).read_text())
except OSError as err:
    print("home: denied", type(err).__name__)
print("env:", os.environ.get("AWS_SECRET_ACCESS_KEY", "absent"))
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=3).close()
    print("listener: connected")
except OSError as err:
    print("listener: denied", type(err).__name__)
'''


@pytest.mark.parametrize("flags", [(), ("--sandbox",)])
@pytest.mark.slow
def test_an_own_run_is_confined_only_with_sandbox(tmp_path, flags):
    home, proj, listener = tmp_path / "home", tmp_path / "proj", Listener()
    home.mkdir()
    proj.mkdir()
    (home / "secret").write_text(SECRET_FILE)
    (proj / "own.py").write_text(OWN)
    try:
        done = repro500("run", *flags, "--command", "-n", "2", "--run-id", "mine", "--metric",
                        "accuracy=regex:Acc@1 ([0-9.]+)", "--accept", "accuracy>=90", "--",
                        sys.executable, "own.py", str(home / "secret"), str(listener.port), cwd=proj,
                        env={"HOME": str(home), "AWS_SECRET_ACCESS_KEY": SECRET_ENV,
                             "MLFLOW_TRACKING_URI": f"sqlite:///{proj / 'mlflow.db'}"})
    finally:
        listener.close()
    assert done.returncode == 0, done.stdout + done.stderr
    said = (proj / "runs" / "mine" / "repeats" / "0" / "stdout.txt").read_text()
    record = json.loads((proj / "runs" / "mine" / "manifest.json").read_text())["facets"]["sandbox"]
    if flags:
        assert "home: denied" in said and "env: absent" in said and "listener: denied" in said
        assert listener.accepted == 0 and record["sandboxed"] is True
        assert str(proj / "runs") in record["writable"] and (proj / "mlflow.db").is_file()
        assert "sandbox: bubblewrap; your code may read" in done.stderr
    else:  # one's own code, as it always ran
        assert "HOMEFILE-9f8e7d6c5b4a" in said and SECRET_ENV in said and "listener: connected" in said
        assert record == {"sandboxed": False}


def test_sandbox_widening_options_of_run_need_sandbox(tmp_path):
    done = repro500("run", "--network", "--command", "--metric", "a=regex:a ([0-9]+)", "--accept", "a>=1", "--",
                    "true", cwd=tmp_path)
    assert done.returncode == 2 and "--sandbox" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "code", "said"), [
    (["missing.yaml"], 4, "recipe missing.yaml does not exist"),
    (["tiny.yaml", "--set", "no_such_key=1"], 2, "no_such_key"),
    (["tiny.yaml", "--repeats", "2", "--params", "absent.yaml"], 4, "absent.yaml"),
])
def test_a_bad_recipe_or_option_of_a_sandboxed_run_is_said_before_the_sandbox_is_set_up(tmp_path, args, code, said):
    """Said once, in one line, by the run itself: no plan line of a sandbox, no runs/ nor MLflow store."""
    write_recipe(tmp_path / "tiny.yaml")
    done = repro500("run", *args, "--sandbox", cwd=tmp_path)
    assert done.returncode == code, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("repro500: error: ")]
    assert len(errors) == 1 and said in errors[0] and "sandbox:" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


LINKER = '''
import os, sys
from pathlib import Path
print("Acc@1 90.5")
if Path.cwd().name == "source":
    os.symlink(sys.argv[1], os.path.join(os.environ["REPRO500_REPEAT_DIR"], "creds"))
'''


@pytest.mark.slow
def test_a_link_planted_in_the_rerun_leading_out_is_refused_not_followed(tmp_path):
    home, lab = tmp_path / "home", tmp_path / "lab"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(SECRET_FILE)
    lab.mkdir()
    (lab / "linker.py").write_text(LINKER)
    write_recipe(lab / "exp.yaml", {
        "schema": "repro500/recipe/v1", "name": "linker",
        "fixed": {"command": [sys.executable, "linker.py", str(home / ".aws" / "credentials")]},
        "metrics": {"accuracy": {"regex": "Acc@1 ([0-9.]+)", "scale": 0.01}},
        "acceptance": {"accuracy": {"target": 0.9, "tolerance": 0.01}}, "repeats": 2, "seed": 1})
    assert repro500("run", "exp.yaml", "--no-tracking", "--run-id", "orig", cwd=lab).returncode == 0
    assert repro500("publish", str(lab / "runs" / "orig"), "--out", str(tmp_path / "pub"), cwd=tmp_path).returncode == 0
    done = _reproduce(tmp_path, "again")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "is a link that leaves the run directory" in done.stderr and "Traceback" not in done.stderr
    assert "HOMEFILE-9f8e7d6c5b4a" not in _everything_in(tmp_path / "again")


def _plugin_recipe() -> dict:
    return {"schema": "repro500/recipe/v1", "name": "evil",
            "fixed": {"workload": "classification", "model": "evilmod:build", "model_options": {"width": 8},
                      "dataset": {"entry": "evilmod:make", "params": {"samples": 32, "seed": 1}},
                      "target": {"metric": "accuracy", "value": 0.999}, "epochs": 1},
            "mutable": {"batch_size": 16, "eval_batch_size": 32, "optimizer": {"name": "sgd", "lr": 0.1},
                        "threads": 1},
            "acceptance": {"accuracy": {"target": 0.5, "tolerance": 0.5}}, "repeats": 2, "seed": 5}


@pytest.mark.slow
def test_a_plugin_recipe_reproduces_sandboxed_to_the_verdict_it_reaches_unconfined(tmp_path):
    """The trainer imports a publication's plug-in inside the sandboxed rerun: the plug-in's attempt on
    the reproducer's HOME fails there, and the verdict is the one an unconfined rerun reaches."""
    import yaml
    from helpers.runs import PLUGIN

    home, lab = tmp_path / "home", tmp_path / "lab"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(SECRET_FILE)
    lab.mkdir()
    marker = tmp_path / "MARKER"
    attempt = (f"import pathlib\nif pathlib.Path.cwd().name != 'lab':\n    try:\n        pathlib.Path({str(marker)!r})"
               f".write_text(pathlib.Path({str(home / '.aws' / 'credentials')!r}).read_text())\n"
               "    except OSError:\n        pass\n")
    (lab / "evilmod.py").write_text(attempt + PLUGIN)
    (lab / "evil.yaml").write_text(yaml.safe_dump(_plugin_recipe()))
    ran = repro500("run", "evil.yaml", "--no-tracking", "--run-id", "r", cwd=lab)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    assert repro500("publish", "runs/r", "--out", str(tmp_path / "pub"), cwd=lab).returncode == 0
    statuses = {}
    for out, flags in (("boxed", ()), ("open", ("--no-sandbox",))):
        done = _reproduce(tmp_path, out, *flags)
        assert done.returncode in (0, 1, 3), done.stdout + done.stderr
        statuses[out] = json.loads((tmp_path / out / "verdict.json").read_text())["status"]
        if out == "boxed":
            assert "sandbox: bubblewrap" in done.stdout and not marker.exists()
    assert statuses["boxed"] == statuses["open"] == "REPRODUCED"
    assert "HOMEFILE-9f8e7d6c5b4a" in marker.read_text()  # unconfined, the same plug-in got it
