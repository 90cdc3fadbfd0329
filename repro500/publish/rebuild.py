"""``reproduce --env venv``: the publication's locked environment, rebuilt in ``OUT/env``.

The lock (``environment.lock.json`` in the packed run, capture/lock.py) is untrusted input: it is
read through :mod:`repro500.untrusted`, and nothing in it is executed or handed to a shell.  Each
requirement the installer gets is rebuilt here from checked parts (a PEP 508 name, a version of
plain characters, an https URL and a 40-hex commit), never taken from the lock's own text; an
index must be https; the experiment's own package is installed only from a path inside
``OUT/source``.  A lock that breaks any of these is refused with one sentence (exit 4).

The build, in order:

1. the recorded Python ``major.minor`` found here (``pythonX.Y`` on PATH, this interpreter, or
   uv's managed Pythons), else exit 4 naming both versions: never a silent rebuild on another;
2. a plan line: the installer, the Python, how many distributions, from which indexes;
3. ``OUT/env`` created, then every pin resolved against its index without installing
   (``--dry-run``): a distribution no index serves is named in one sentence (exit 4), with
   ``--env current`` and ``--find-links DIR`` as the two ways on;
4. the pins installed (``--no-deps``: the lock is the whole closure), the experiment's own
   package from ``OUT/source``, and — for a built-in recipe, which runs inside repro500 —
   the repro500 running now;
5. ``OUT/env/.repro500-built`` written last, holding the lock's digest: a rebuild interrupted
   before it is found unfinished next time and redone from scratch; a finished one for the same
   lock is reused as it is.

uv (https://docs.astral.sh/uv/) installs when it is on PATH (its cache makes a second rebuild a
matter of links); pip otherwise, run from this interpreter against the new venv (``--python``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.publish.datafiles import safe_relpath
from repro500.redact import redact_url
from repro500.rundir import layout

ENV_DIR = "env"
MARKER = ".repro500-built"
MODES = ("current", "venv")
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,200}[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9.+!_-]{1,100}$")
_PY_VERSION = re.compile(r"^(\d{1,2})\.(\d{1,3})\.(\d{1,3})[A-Za-z0-9]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_URL = re.compile(r"^https://[A-Za-z0-9.-]+(?::\d+)?/[A-Za-z0-9._~/%+=,-]*$")
_MISSING = re.compile(r"(?:No matching distribution found for|Because|because)\s+([A-Za-z0-9._-]+)\s*(?:==|was not found)")


@dataclass
class Pins:
    """What a checked lock asks the installer for."""

    python: str  # X.Y.Z
    requirements: list[str]
    index: str | None
    extra_indexes: list[str]
    own: list[tuple[str, Path]]  # (name, directory in OUT/source): the experiment's own packages
    editable: set[str]
    unpinnable: list[str]  # "name version: why" — left out, named in the plan line
    digest: str


def _checked_url(value: Any, what: str) -> str:
    text = str(value or "")
    if not _URL.match(text):
        raise InvalidInput(f"the publication's environment lock names {what} {untrusted.shown(text)[:120]!r}, which "
                           "is not a plain https URL: refusing the lock (reproduce with --env current)")
    return text


def read(reference: Path, source: Path | None) -> Pins:
    """The checked pins of the packed run's lock (*source*: ``OUT/source``, where its own package is)."""
    path = reference / layout.LOCK
    try:
        raw = untrusted.read_bytes(path, "the environment lock")
    except FileNotFoundError:
        raise InvalidInput("this publication has no environment lock (it predates them): reproduce it with "
                           "--env current") from None
    doc = untrusted.load_json(raw, str(path))
    if not isinstance(doc, dict) or doc.get("schema") != "repro500/environment-lock/v1":
        raise InvalidInput(f"{path} is not a repro500/environment-lock/v1 document")
    if not doc.get("applies"):
        raise InvalidInput(f"the publication's run has no Python environment to rebuild ({untrusted.shown(doc.get('why'))}): "
                           "reproduce it with --env current")
    python = str((doc.get("python") or {}).get("version") or "")
    if not _PY_VERSION.match(python):
        raise InvalidInput(f"the environment lock's Python version {untrusted.shown(python)!r} is not a version")
    index = doc.get("index") or {}
    main = index.get("url")
    main = _checked_url(main, "the index") if main and "[REDACTED]" not in str(main) else None
    extra = [_checked_url(u, "an index") for u in index.get("extra") or [] if "[REDACTED]" not in str(u)]
    requirements, own, editable, unpinnable = [], [], set(), []
    for entry in doc.get("distributions") or []:
        if not isinstance(entry, dict):
            raise InvalidInput("the environment lock's distributions must be objects")
        name, version = str(entry.get("name")), str(entry.get("version"))
        if not _NAME.match(name) or not _VERSION.match(version):
            raise InvalidInput(f"the environment lock names {untrusted.shown(name)[:80]!r} "
                               f"{untrusted.shown(version)[:40]!r}, which is not a distribution name and version")
        kind = entry.get("kind")
        if kind == "tool":
            continue
        if kind == "index" and entry.get("requirement"):
            if entry.get("index"):
                url = _checked_url(entry["index"], "an index")
                if url not in extra:
                    extra.append(url)
            requirements.append(f"{name}=={version}")
        elif kind == "vcs" and entry.get("requirement"):
            commit = str(entry.get("commit") or "")
            if not _COMMIT.match(commit):
                raise InvalidInput(f"the environment lock's commit for {name} is not a 40-hex commit")
            requirements.append(f"{name} @ git+{_checked_url(entry.get('url'), 'a repository')}@{commit}")
        elif kind == "archive" and entry.get("requirement"):
            requirements.append(f"{name} @ {_checked_url(entry.get('url'), 'an archive')}")
        elif kind == "local" and entry.get("experiment"):
            rel = safe_relpath(entry.get("source_path"), f"the source path of {name}")
            if source is None or not (source / rel).resolve().is_relative_to(source.resolve()) \
                    or not (source / rel).is_dir():
                unpinnable.append(f"{name} {version}: the experiment's own package, not in the publication's source/")
                continue
            own.append((name, source / rel))
            if entry.get("editable"):
                editable.add(name)
        else:
            unpinnable.append(f"{name} {version}: {untrusted.shown(entry.get('why') or 'not pinned')[:200]}")
    return Pins(python, requirements, main, extra, own, editable, unpinnable, hashlib.sha256(raw).hexdigest())


# ----- the interpreter and the installer ---------------------------------------------------------
def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def find_python(wanted: str) -> str:
    """An interpreter of the recorded ``major.minor`` here; InvalidInput naming both versions."""
    minor = _minor(wanted)
    candidates = [sys.executable, shutil.which(f"python{minor}") or ""]
    uv = shutil.which("uv")
    if uv:
        found = subprocess.run([uv, "python", "find", minor], capture_output=True, text=True, timeout=60, check=False)
        candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    for candidate in (c for c in candidates if c):
        if _minor(_version_of(candidate) or "") == minor:
            return candidate
    here = _version_of(sys.executable) or "unknown"
    raise InvalidInput(f"the publication's environment needs Python {minor} ({wanted}) and this machine has "
                       f"Python {_minor(here)} ({sys.executable}; no python{minor} on PATH): install Python "
                       f"{minor}, or reproduce with --env current")


def installer() -> str:
    return "uv" if shutil.which("uv") else "pip"


def _install_cmd(env_python: Path, pins: Pins, find_links: list[Path]) -> list[str]:
    """The installer's command line, up to its requirements (no shell, no lock text in it)."""
    if installer() == "uv":
        cmd = [shutil.which("uv") or "uv", "pip", "install", "--python", str(env_python), "--no-deps"]
        # uv asks each index in turn; the PyTorch index comes first for torch's local builds
        cmd += ["--index-strategy", "unsafe-best-match"] if pins.extra_indexes else []
    else:
        cmd = [sys.executable, "-m", "pip", "--python", str(env_python), "install", "--no-deps",
               "--disable-pip-version-check", "--no-input"]
    if pins.index:
        cmd += ["--index-url", pins.index]
    for url in pins.extra_indexes:
        cmd += ["--extra-index-url", url]
    for folder in find_links:
        cmd += ["--find-links", str(folder)]
    return cmd


def _tool_requirement() -> tuple[list[str], str]:
    """How to install the repro500 running now: from its directory when installed from one (an
    editable checkout), else its release from the index."""
    dist = metadata.distribution("repro500")
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        info = {}
    url = str(info.get("url") or "")
    if url.startswith("file://") and "dir_info" in info:
        from urllib.parse import unquote, urlparse

        folder = unquote(urlparse(url).path)
        return (["-e", folder] if (info.get("dir_info") or {}).get("editable") else [folder]), f"repro500 from {folder}"
    return [f"repro500=={dist.version}"], f"repro500 {dist.version}"


def _run(cmd: list[str], what: str, console: Any) -> subprocess.CompletedProcess[str]:
    console.print(f"  {what} ...", highlight=False)
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)


def _missing(stderr: str) -> str | None:
    found = _MISSING.search(stderr)
    return found.group(1) if found else None


def build(pins: Pins, out: Path, *, with_tool: bool, find_links: list[Path], console: Any) -> Path:
    """``OUT/env`` holding the locked environment (see the module docstring); its Python."""
    env = out / ENV_DIR
    env_python = env / "bin" / "python"
    marker = env / MARKER
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == f"{pins.digest} tool={with_tool}":
        console.print(f"environment: {env} already holds this publication's lock (rebuilt earlier); reusing it",
                      highlight=False, soft_wrap=True)
        return env_python
    python = find_python(pins.python)
    tool_args, tool_label = _tool_requirement() if with_tool else ([], "")
    indexes = ", ".join(redact_url(u) for u in [pins.index or "the installer's default index", *pins.extra_indexes])
    left = f"; not installable, left out: {'; '.join(pins.unpinnable)}" if pins.unpinnable else ""
    own = f" + the experiment's own {', '.join(n for n, _ in pins.own)} from source/" if pins.own else ""
    console.print(f"environment: rebuilding in {env} with {installer()}: Python {_minor(pins.python)} "
                  f"({python}), {len(pins.requirements)} pinned distributions from {indexes}{own}"
                  f"{' + ' + tool_label if with_tool else ''}{left}", highlight=False, soft_wrap=True)
    if env.exists():  # an unfinished or another lock's rebuild is never taken for this one
        shutil.rmtree(env)
    created = _run([python, "-m", "venv", "--without-pip", str(env)], "creating the venv", console)
    if created.returncode != 0:
        raise InvalidInput(f"cannot create a venv with {python}: {created.stderr.strip()[-300:]}")
    base = _install_cmd(env_python, pins, find_links)
    if pins.requirements:
        req = env / "requirements.repro500.txt"
        req.write_text("\n".join(pins.requirements) + "\n", encoding="utf-8")
        checked = _run([*base, "--dry-run", "-r", str(req)], "checking that the indexes serve every pin", console)
        if checked.returncode != 0:
            shutil.rmtree(env, ignore_errors=True)
            name = _missing(checked.stderr) or "a locked distribution"
            raise InvalidInput(f"{name} (pinned by the publication's lock) is served by no index reachable here "
                               f"({indexes}): reproduce with --env current, or provide it with --find-links DIR "
                               f"(nothing was installed)")
        done = _run([*base, "-r", str(req)], f"installing {len(pins.requirements)} distributions", console)
        if done.returncode != 0:
            raise InvalidInput(f"installing the locked environment failed ({installer()}: "
                               f"{done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else 'no message'}); "
                               f"{env} is left unfinished and will be rebuilt next time; or reproduce with --env current")
    for name, folder in pins.own:
        args = ["-e", str(folder)] if name in pins.editable else [str(folder)]
        done = _run([*base, *args], f"installing the experiment's own {name} from {folder}", console)
        if done.returncode != 0:
            raise InvalidInput(f"installing the experiment's own package {name} from {folder} failed: "
                               f"{done.stderr.strip()[-300:]}")
    if with_tool:
        done = _run([*base, *tool_args], f"installing {tool_label}", console)
        if done.returncode != 0:
            raise InvalidInput(f"installing {tool_label} into {env} failed: {done.stderr.strip()[-300:]}")
    marker.write_text(f"{pins.digest} tool={with_tool}\n", encoding="utf-8")  # last: the rebuild is complete
    return env_python


def check_mode(mode: str, find_links: list[str]) -> list[Path]:
    if mode not in MODES:
        raise UsageError(f"--env {mode}: choose one of {', '.join(MODES)}")
    if find_links and mode != "venv":
        raise UsageError("--find-links serves a rebuilt environment: it goes with --env venv")
    folders = [Path(f) for f in find_links]
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--find-links {folder} is not a directory")
    return [f.resolve() for f in folders]


def activated(env_python: Path, environ: dict[str, str]) -> dict[str, str]:
    """*environ* as a venv's activation leaves it: its bin first on PATH (a command's ``python``)."""
    bin_dir = str(env_python.parent.resolve())
    out = {k: v for k, v in environ.items() if k not in ("PYTHONHOME", "CONDA_PREFIX")}
    out["PATH"] = os.pathsep.join([bin_dir, *(p for p in environ.get("PATH", "").split(os.pathsep) if p)])
    out["VIRTUAL_ENV"] = str(env_python.parent.parent.resolve())
    return out
