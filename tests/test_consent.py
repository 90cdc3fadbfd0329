"""Consent for code: one function (repro500.untrusted.consent) decides whether code a publication or
a packed run chose may run here, and every path that would run such code asks it first.

Each hostile input is built as a publisher would build it: a wheel whose ``.pth`` file runs at
every start of the venv it is installed in, a plug-in module imported by a packed run's replay,
recorded variables that load a library into a replay.  What they run writes a marker file only
where the test asks it to (``CONSENT_MARKER``), so the publisher's own run writes none.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers.rundirs import make_manifest, make_run
from helpers.runs import PLUGIN, repro500
from helpers.venvs import venv_with

from repro500 import untrusted
from repro500.errors import UsageError
from repro500.locate import environment as locate_env
from repro500.publish import rebuild
from repro500.rundir import layout
from repro500.verify.rundir import load_run

ROOT = Path(__file__).resolve().parents[1]
MARKER_ENV = "CONSENT_MARKER"
# what the publisher's code does where it runs: write down that it ran, and the variables it was given
WRITES_MARKER = ("import os, json; os.environ.get('CONSENT_MARKER') and open(os.environ['CONSENT_MARKER'], 'w')"
                 ".write(json.dumps({k: os.environ.get(k) for k in ('OMP_TOOL_LIBRARIES', 'NCCL_NET_PLUGIN', "
                 "'OMP_NUM_THREADS')}))")
PUBLISHERS_INDEX = "https://127.0.0.1:9/simple"  # the index the publisher's lock names: nothing answers there


# ----- the one decision ---------------------------------------------------------------------------
def test_the_consent_decides_by_origin_and_run_code() -> None:
    assert untrusted.consent(False, None) is False  # nothing of the run's own would run
    assert untrusted.consent(False, "runs its own code (plug-in: nets.py)", origin=untrusted.OWN_RUN) is True
    assert untrusted.consent(True, "runs its own code (plug-in: nets.py)", origin=untrusted.PACKED_RUN) is True
    for origin in untrusted.FOREIGN:
        with pytest.raises(UsageError) as err:
            untrusted.consent(False, "runs its own code (plug-in: nets.py)", origin=origin, instead="do X")
        assert err.value.exit_code == 2
        assert str(err.value).endswith("runs its own code (plug-in: nets.py); review it and pass --run-code to "
                                       "run it, or do X")


# ----- reproduce --env venv: building the environment runs the publication's code -----------------
def _pth_wheel(out: Path, name: str = "evil-pth", version: str = "1.0") -> Path:
    """A real pure-Python wheel whose ``.pth`` file runs at every start of the Python it is in."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"VALUE = 1\n",
        f"{module}.pth": (WRITES_MARKER + "\n").encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    lines = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
             for n, d in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    path = out / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for n, d in files.items():
            archive.writestr(n, d)
    return path


@pytest.fixture(scope="module")
def pth_publication(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A publication of a command run by a venv holding the ``.pth`` wheel, its lock naming the
    publisher's own index."""
    root = tmp_path_factory.mktemp("publisher")
    wheels = root / "wheels"
    wheels.mkdir()
    _pth_wheel(wheels)
    venv = root / "venv"
    venv_with(venv, wheels, "evil-pth==1.0")
    proj = root / "proj"
    proj.mkdir()
    (proj / "s.py").write_text("import evil_pth\nprint('acc', 0.9)\n")
    env = {"PIP_INDEX_URL": PUBLISHERS_INDEX}
    ran = repro500("run", "--command", "--metric", "acc=regex:acc ([0-9.]+)", "--accept", "acc>=0.5±0.05", "-n", "2",
                   "--no-tracking", "--run-id", "orig", "--", str(venv / "bin" / "python"), "s.py", cwd=proj, env=env)
    assert ran.returncode in (0, 3), ran.stdout + ran.stderr
    lock = json.loads((proj / "runs" / "orig" / "environment.lock.json").read_text())
    assert lock["index"]["url"] == PUBLISHERS_INDEX
    assert any(d["name"] == "evil-pth" and d["kind"] == "index" for d in lock["distributions"])
    done = repro500("publish", "runs/orig", "--out", str(root / "pub"), cwd=proj, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "pub"


def test_env_venv_without_run_code_is_refused_before_anything_is_written(tmp_path: Path,
                                                                         pth_publication: Path) -> None:
    marker = tmp_path / "MARKER"
    out = tmp_path / "OUT"
    done = repro500("reproduce", str(pth_publication), "--env", "venv", "--out", str(out), cwd=tmp_path,
                    env={MARKER_ENV: str(marker)})
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert "Traceback" not in done.stderr and len(message.splitlines()) == 1, message
    assert "builds its environment" in message and ".pth" in message and "--run-code" in message
    assert "--env current" in message
    assert not marker.exists() and not (out / "env").exists() and not out.exists()


@pytest.mark.slow
def test_with_run_code_the_build_asks_only_the_reproducers_index(tmp_path: Path, pth_publication: Path) -> None:
    marker = tmp_path / "MARKER"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _pth_wheel(wheels)
    out = tmp_path / "OUT"
    # the reproducer's own configuration: no index, the wheel from a folder of theirs
    env = {MARKER_ENV: str(marker), rebuild.INSTALLER_ENV: "pip", "PIP_NO_INDEX": "1", "PIP_INDEX_URL": "",
           "PIP_FIND_LINKS": ""}
    # --no-sandbox: the marker lies outside what a sandbox grants, and the recipe names the publisher's
    # own venv by its absolute path (tests/test_sandbox.py: what the sandbox denies)
    done = repro500("reproduce", str(pth_publication), "--env", "venv", "--run-code", "--no-sandbox",
                    "--find-links", str(wheels), "--out", str(out), cwd=tmp_path, env=env, timeout=600)
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr
    plan = next(line for line in done.stdout.splitlines() if line.startswith("environment: rebuilding"))
    assert f"not asked: the lock's {PUBLISHERS_INDEX}, not an index of yours (--index URL asks it)" in plan
    assert "from no index (yours say none), 1 from --find-links" in plan, plan  # PIP_NO_INDEX: theirs
    assert marker.exists()  # consented: the wheel's .pth ran, as it would on the publisher's machine


def test_the_installer_gets_no_index_the_lock_names_unless_the_reproducer_names_it(monkeypatch) -> None:
    monkeypatch.setenv(rebuild.INSTALLER_ENV, "pip")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    evil, torch_index = "https://evil.example/simple", "https://download.pytorch.org/whl/cpu"
    pins = rebuild.Pins("3.11.7", ["a==1", "torch==2.5.0+cpu"], evil, [torch_index], [], set(), [], "d",
                        released=[("a", "1", None), ("torch", "2.5.0+cpu", torch_index)])
    cmd = rebuild.install_cmd(Path("/x/bin/python"), [])
    assert "--index-url" not in cmd and "--extra-index-url" not in cmd and evil not in cmd
    served = rebuild.serving(pins)
    assert served.asked() == ["https://pypi.org/simple"] and served.unused == [evil, torch_index]
    assert served.text() == "from https://pypi.org/simple"
    assert served.not_asked() == ("; not asked: the lock's https://evil.example/simple, "
                                  f"{torch_index} (the lock names it for torch), not an index of yours "
                                  "(--index URL asks it)")
    # named by the reproducer: asked, for the pins the lock names it for
    named = rebuild.serving(pins, [torch_index])
    assert named.unused == [evil] and named.indexes_for(torch_index)[0] == torch_index
    assert f"and, as --index names, {torch_index} (the lock names it for torch)" in named.text()
    cmd = rebuild.install_cmd(Path("/x/bin/python"), [], [torch_index])
    assert cmd[-2:] == ["--extra-index-url", torch_index] and evil not in cmd
    # the reproducer's own index is theirs, whatever the lock says
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:pw@mirror.example/simple/")
    mine = rebuild.serving(rebuild.Pins("3.11.7", ["a==1"], "https://mirror.example/simple", [], [], set(), [], "d"))
    assert mine.unused == [] and "pw" not in mine.text()


def test_index_is_a_usage_error_without_env_venv_or_a_url(tmp_path: Path) -> None:
    done = repro500("reproduce", "nowhere", "--index", "https://pypi.example/simple", cwd=tmp_path)
    assert done.returncode == 2 and "--index" in done.stderr and "--env venv" in done.stderr
    done = repro500("reproduce", "nowhere", "--env", "venv", "--run-code", "--index", "file:///etc", cwd=tmp_path)
    assert done.returncode == 2 and "not an http(s) URL" in done.stderr, done.stderr


def test_sources_built_here_are_named(tmp_path: Path) -> None:
    doc = {"schema": "repro500/environment-lock/v1", "applies": True, "python": {"version": "3.11.7"},
           "index": {"url": None, "extra": []}, "distributions": [
               {"name": "g", "version": "1", "kind": "vcs", "requirement": "x", "url": "https://h/r", "commit": "a" * 40},
               {"name": "s", "version": "1", "kind": "archive", "requirement": "x", "url": "https://h/s-1.tar.gz"},
               {"name": "w", "version": "1", "kind": "archive", "requirement": "x", "url": "https://h/w-1-py3-none-any.whl"}]}
    (tmp_path / "environment.lock.json").write_text(json.dumps(doc))
    assert rebuild.read(tmp_path, None).from_source == ["g (git)", "s (archive)"]


# ----- locate: a packed run's plug-in is imported by its replays ----------------------------------
EVIL = WRITES_MARKER.replace("import os, json; ", "import os, json\n") + "\n" + PLUGIN


@pytest.fixture(scope="module")
def packed_plugin_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed run of a plug-in model whose module writes the marker when imported, run with
    variables that would load a library into a process that takes them."""
    proj = tmp_path_factory.mktemp("lab")
    (proj / "evilmod.py").write_text(EVIL)
    recipe = {
        "schema": "repro500/recipe/v1", "name": "evil",
        "fixed": {"workload": "classification", "model": "evilmod:build", "model_options": {"width": 8},
                  "dataset": {"entry": "evilmod:make", "params": {"samples": 32, "seed": 1}},
                  "target": {"metric": "accuracy", "value": 0.999}, "epochs": 1},
        "mutable": {"batch_size": 16, "eval_batch_size": 32, "optimizer": {"name": "sgd", "lr": 0.1}, "threads": 1},
        "acceptance": {"accuracy": {"target": 0.5, "tolerance": 0.5}}, "repeats": 2, "seed": 5,
    }
    (proj / "evil.yaml").write_text(yaml.safe_dump(recipe))
    env = {"OMP_TOOL_LIBRARIES": str(proj / "libevil.so"), "NCCL_NET_PLUGIN": "evil", "OMP_NUM_THREADS": "1"}
    ran = repro500("run", "evil.yaml", "--same-seed", "--no-tracking", "--run-id", "r", cwd=proj, env=env)
    assert ran.returncode in (0, 1, 3), ran.stdout + ran.stderr
    assert (proj / "runs" / "r" / "source" / "evilmod.py").is_file()
    packed = repro500("pack", "runs/r", "-o", str(proj / "r.tar.gz"), cwd=proj)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    return proj / "r.tar.gz"


def test_locate_refuses_a_packed_runs_plugin_without_run_code(tmp_path: Path, packed_plugin_run: Path) -> None:
    marker = tmp_path / "MARKER"
    done = repro500("locate", str(packed_plugin_run), "--steps", "1", cwd=tmp_path, env={MARKER_ENV: str(marker)})
    message = done.stderr.strip()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(message.splitlines()) == 1, message
    assert "this packed run" in message and "evilmod.py" in message and "--run-code" in message
    assert not marker.exists()


@pytest.mark.slow  # four replays (a minute under load); the allow-list's own test stays in make test
def test_with_run_code_the_replay_gets_no_library_loading_variable(tmp_path: Path, packed_plugin_run: Path) -> None:
    marker = tmp_path / "MARKER"
    # --no-sandbox: the marker's variable and file lie outside what the sandbox grants (tests/test_sandbox.py)
    done = repro500("locate", str(packed_plugin_run), "--steps", "1", "--run-code", "--no-sandbox", "--json",
                    cwd=tmp_path, env={MARKER_ENV: str(marker)})
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert marker.exists()  # consented: the plug-in ran in its replay
    seen = json.loads(marker.read_text())  # as the replay process saw them
    assert seen["OMP_TOOL_LIBRARIES"] is None and seen["NCCL_NET_PLUGIN"] is None and seen["OMP_NUM_THREADS"] == "1"
    assert "OMP_TOOL_LIBRARIES" not in answer["environments"]["A"]
    assert answer["environments_not_set"]["A"] == ["NCCL_NET_PLUGIN", "OMP_TOOL_LIBRARIES"]


def test_a_runs_own_code_is_named_the_same_way_by_every_consent(tmp_path: Path) -> None:
    run = make_run(tmp_path, values={"accuracy": [0.9, 0.9]})
    assert layout.own_code(run) is None  # a built-in recipe, no source/: nothing of its own runs
    (run / layout.SOURCE_INDEX).write_text(json.dumps({"files": [{"path": f"m{i}.py"} for i in range(7)]
                                                      + [{"path": "evil\x1b[2Jname.py"}]}))
    code = layout.own_code(run)
    assert code == ("plug-in", [*(f"m{i}.py" for i in range(7)), "evil\x1b[2Jname.py"])
    assert layout.own_code_said(code) == "plug-in: m0.py, m1.py, m2.py, m3.py, m4.py and 3 more"
    said = layout.own_code_said(("command", ["evil\x1b[2Jname.py"]))
    assert "\x1b" not in said and said.startswith("command: evil") and layout.own_code_said(("command", [])) == "command"


def test_the_replay_environment_takes_only_the_allow_list(tmp_path: Path) -> None:
    recorded = {"OMP_NUM_THREADS": "3", "ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_TOOL_LIBRARIES": "/tmp/libevil.so",
                "OMP_TOOL": "enabled", "NCCL_NET_PLUGIN": "evil", "NCCL_TUNER_PLUGIN": "evil",
                "NCCL_DEBUG_FILE": "/home/you/.bashrc", "KMP_AFFINITY": "compact\nX=1", "LD_PRELOAD": "/tmp/e.so"}
    manifest = make_manifest(environment={"env": {"values": recorded, "names": []}})
    run = load_run(make_run(tmp_path, manifest=manifest, values={"accuracy": [0.9, 0.9]}))
    env = locate_env.replay_environment(run, {"OMP_TOOL_LIBRARIES": "mine.so", "OMP_NUM_THREADS": "2"})
    assert env == {"OMP_NUM_THREADS": "3", "ONEDNN_MAX_CPU_ISA": "SSE41"}  # the reproducer's own stays theirs
    assert locate_env.replay_env_not_set(run) == ["KMP_AFFINITY", "NCCL_DEBUG_FILE", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
                                          "OMP_TOOL", "OMP_TOOL_LIBRARIES"]
    assert not any(re.search(r"TOOL|PLUGIN|FILE|LIBRAR|PRELOAD", name) for name in locate_env.REPLAY_ENV_NAMES)


# ----- every door asks the consent ----------------------------------------------------------------
# What starts code a run chose: a child told whether it may import the run's own code, a venv made
# for a publication's lock, a replay of a run.  A module with one of these asks the consent itself.
DOORS = {"sets the foreign-code switch": re.compile(r"CODE_ENV\]\s*="),
         "makes a venv": re.compile(r"""["']-m["'],\s*["']venv["']"""),
         "starts a replay": re.compile(r"\bSide\(\s*run_dir=")}


def test_every_module_that_starts_a_runs_code_asks_the_consent() -> None:
    missing = []
    for path in sorted((ROOT / "repro500").rglob("*.py")):
        if path.name == "untrusted.py":
            continue
        text = path.read_text(encoding="utf-8")
        doors = [what for what, pattern in DOORS.items() if pattern.search(text)]
        if doors and not re.search(r"\bconsent\(", text):
            missing.append(f"{path.relative_to(ROOT)} {', '.join(doors)} without asking untrusted.consent")
    assert not missing, missing
    # and the doors are there to be found: a pattern that matches nothing checks nothing
    everything = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "repro500").rglob("*.py"))
    assert all(pattern.search(everything) for pattern in DOORS.values())
