"""Whether MLflow, in the Python a wrapped command runs, loads repro500's run-context provider.

A metric read from the script's MLflow runs is found by the tags the provider puts on them
(repro500.tracking.context).  Where MLflow cannot load it — repro500 not installed in the
command's Python, a ``repro500`` package of the experiment's own shadowing ours on the child's
``sys.path``, a module that fails to import — MLflow only warns, the script's runs go untagged,
and every repeat would fail with "no MLflow run".  So before anything is written, the provider is
loaded the way MLflow loads it: MLflow's own registry imported in the command's interpreter, with
the command's environment and the first ``sys.path`` entry the command will have, and the
provider found among the registered ones and asked for its tags.

That costs MLflow's import (2-4 s) in a child process, on the critical path of a run.  A success
is therefore remembered, in repro500's cache directory, under a digest of what decides it: the
interpreter (its path and file), its site-packages directories (an install or uninstall changes
them), the user site, the Python variables of the environment and repro500's own modules (an
editable install); with it, the modules the check imported, and what the command's first
``sys.path`` entries (the script's directory, ``PYTHONPATH``) hold under their names (a
``repro500`` or ``mlflow`` of the experiment's own, a ``yaml.py`` beside the script).  A run with
the same digests skips the child (a few hundred ``stat`` calls, about 10 ms); a failure is never
remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from repro500 import __version__
from repro500.capture.cache import cache_dir
from repro500.errors import InvalidInput
from repro500.rundir import atomic

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_TIMEOUT_S = 180
_CACHE_FILE = "mlflow-provider.json"
_CACHE_KEEP = 64
_PY_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH")
# Loads the registry as ``import mlflow`` does (entry points loaded, failures warned and skipped),
# then finds repro500's provider and asks it for its tags inside a (pretend) repeat.
_CHECK = r"""
import json, sys, warnings
sys.path[0] = sys.argv[1]
out = {"ok": False, "reason": None}
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from mlflow.tracking.context import registry
    ours = [p for p in registry._run_context_provider_registry if type(p).__module__ == "repro500.tracking.context"]
    if ours:
        tags = ours[0].tags() if ours[0].in_context() else {}
        out["ok"] = tags.get("repro500.run_id") == "provider-check"
        out["reason"] = None if out["ok"] else "it gives the tags %r inside a repeat" % (tags,)
    else:
        said = [str(w.message) for w in caught if "context provider" in str(w.message)]
        out["reason"] = said[0] if said else "its entry point (group mlflow.run_context_provider) is not registered there"
except BaseException as err:
    out["reason"] = "%s: %s" % (type(err).__name__, err)
try:
    import importlib.util
    found = importlib.util.find_spec("repro500")
    out["repro500"] = found.origin if found is not None else None
except BaseException:
    out["repro500"] = None
out["modules"] = sorted({name.partition(".")[0] for name in list(sys.modules)})
print("\n" + json.dumps(out))
"""


def interpreter(argv: list[str], found: str, env: Mapping[str, str]) -> str:
    """The Python the command runs MLflow in: the program itself when it is ``python``, the
    interpreter a script's ``#!`` line names (``torchrun``, ``./train.py``), else repro500's own
    (a shell script calling ``python``: most likely the one repro500 runs in)."""
    import shutil

    path = env.get("PATH", os.defpath)
    if _PYTHON.match(Path(argv[0]).name):
        return found
    try:
        with open(found, "rb") as fh:
            first = fh.readline(256).decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable
    if first.startswith("#!"):
        words = first[2:].split()
        if words and Path(words[0]).name == "env" and len(words) > 1:
            words = words[1:]
        if words and _PYTHON.match(Path(words[0]).name):
            return words[0] if os.path.isabs(words[0]) else (shutil.which(words[0], path=path) or sys.executable)
    return sys.executable


def first_path(argv: list[str], workdir: Path) -> Path:
    """The first ``sys.path`` entry the command's Python will have: the script's directory for
    ``python X.py`` (and a ``#!`` script), else the working directory (``python -m``, ``-c``)."""
    if not _PYTHON.match(Path(argv[0]).name):
        return (workdir / argv[0]).resolve().parent if os.sep in argv[0] else workdir
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-m", "-c") or arg.startswith(("-m", "-c")) and not arg.startswith("--"):
            return workdir
        if arg in ("-W", "-X"):
            next(args, None)  # the option's value
        elif not arg.startswith("-"):
            return (workdir / arg).resolve().parent
    return workdir


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def _site_dirs(python: str, env: Mapping[str, str]) -> list[Path]:
    prefix = Path(python).parent.parent
    found = [p for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/site-packages")
             for p in sorted(prefix.glob(pattern))]
    base = Path(env.get("PYTHONUSERBASE") or Path.home() / ".local")
    return found + sorted(base.glob("lib/python3*/site-packages"))


def cache_key(python: str, env: Mapping[str, str]) -> str | None:
    """A digest of what decides the check apart from the command's first ``sys.path`` entries
    (module docstring); None when the interpreter's site-packages cannot be found (then nothing
    is remembered)."""
    sites = _site_dirs(python, env)
    if not any(p.is_dir() for p in sites):
        return None
    own = Path(__file__).resolve().parents[1]
    facts = {
        "repro500": __version__, "python": [python, os.path.realpath(python), _stat(Path(os.path.realpath(python)))],
        "sites": [[str(p), _stat(p)] for p in sites],
        "env": {k: env.get(k) for k in _PY_VARIABLES},
        "own": [[p.name, _stat(p)] for p in sorted(own.glob("*.py"))],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def shadows(modules: list[str], path0: Path, workdir: Path, env: Mapping[str, str]) -> str:
    """A digest of what the command's first ``sys.path`` entries (the script's directory, then
    ``PYTHONPATH``) hold under the names of the modules the check imported (``mlflow``,
    ``repro500``, ``yaml``, ...): the same digest, the same modules load as in the check."""
    entries = [path0, *(workdir / e for e in (env.get("PYTHONPATH") or "").split(os.pathsep) if e)]
    found = [[_stat(entry / name), _stat(entry / f"{name}.py")] for entry in entries for name in modules]
    return hashlib.sha256(json.dumps(found).encode()).hexdigest()


def _remembered(key: str, path0: Path, workdir: Path, env: Mapping[str, str]) -> bool:
    try:
        known = json.loads((cache_dir("checks") / _CACHE_FILE).read_text(encoding="utf-8"))["ok"][key]
        return bool(known["shadows"] == shadows(list(known["modules"]), path0, workdir, env))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _remember(key: str, modules: list[str], path0: Path, workdir: Path, env: Mapping[str, str]) -> None:
    try:
        path = cache_dir("checks") / _CACHE_FILE
        try:
            known = dict(json.loads(path.read_text(encoding="utf-8"))["ok"])
        except (OSError, ValueError, KeyError, TypeError):
            known = {}
        known.pop(key, None)
        known[key] = {"modules": modules, "shadows": shadows(modules, path0, workdir, env)}
        atomic.write_json(path, {"ok": dict(list(known.items())[-_CACHE_KEEP:])})
    except OSError:
        pass  # an unwritable cache costs the check again next time, nothing else


def check(where: str, argv: list[str], found: str, workdir: Path, env: Mapping[str, str]) -> None:
    """InvalidInput (one sentence) unless MLflow loads repro500's provider in the command's Python."""
    python = interpreter(argv, found, env)
    path0 = first_path(argv, workdir)
    key = cache_key(python, env)
    if key is not None and _remembered(key, path0, workdir, env):
        return
    child_env = {**env, "REPRO500_RUN_ID": "provider-check", "REPRO500_REPEAT": "0",
                 "MLFLOW_DISABLE_TELEMETRY": env.get("MLFLOW_DISABLE_TELEMETRY", "true")}
    child_env.pop("REPRO500_MLFLOW_READY", None)
    try:
        done = subprocess.run([python, "-c", _CHECK, str(path0)], cwd=workdir, env=child_env, capture_output=True,
                              text=True, timeout=_TIMEOUT_S, check=False)
        lines = done.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {"ok": False}
        if not result.get("reason") and not result.get("ok"):
            result["reason"] = (done.stderr.strip().splitlines() or [f"it exited with status {done.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired, ValueError) as err:
        result = {"ok": False, "reason": f"{python} could not be asked ({err})"}
    if result.get("ok"):
        if key is not None:
            _remember(key, [str(m) for m in result.get("modules") or []], path0, workdir, env)
        return
    origin = result.get("repro500")
    shadow = f"; there, repro500 is {origin}" if origin and not str(origin).startswith(str(Path(__file__).resolve().parents[1])) else ""
    raise InvalidInput(f"{where}: metrics read from MLflow need repro500's MLflow run-context provider, but MLflow in "
                       f"the command's Python ({python}) does not load it ({result.get('reason')}){shadow}: install "
                       "repro500 in that Python (pip install repro500), rename what shadows it, or read the metric "
                       "from another source")
