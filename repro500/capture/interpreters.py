"""The environment a wrapped command actually ran: its Python interpreters, or its program.

repro500 itself may be installed anywhere (its own venv, pipx) while the command runs another
Python (``/path/to/venv/bin/python s.py``, a conda env on ``PATH``).  The command's Python
processes load repro500's ``sitecustomize`` (workloads/command/childsite), whose first process of
each interpreter lists the executable, version, prefixes and the ``*.dist-info``/``*.egg-info``
directories on its ``sys.path``.  After the repeat, :func:`read_hook_records` reads those
directories' metadata here (the command pays only a ``listdir`` per path entry), and the repeat
keeps them as ``repeats/<k>/interpreters.json``; :func:`command_environment` then makes the
manifest's environment facet describe the experiment's interpreter, with repro500's own kept
apart as the tool's.  A command with no Python process records its program (path, digest) and
says that no lock applies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.capture import env as env_facet
from repro500.digest import file_digest
from repro500.errors import InvalidInput

SCHEMA = "repro500/interpreters/v1"
_HOOK_FILE_GLOB = "python-*.txt"


def _parse_hook_file(path: Path) -> dict[str, Any] | None:
    try:
        if path.is_symlink():
            return None
        # written by the command's own processes: a regular file under the cap, else not read
        with untrusted.open_regular(path, "an interpreter record", untrusted.MAX_HOOK_BYTES) as handle:
            text = handle.read(untrusted.MAX_HOOK_BYTES + 1).decode("utf-8", errors="surrogateescape")
            started = os.fstat(handle.fileno()).st_mtime_ns
    except (OSError, InvalidInput):
        return None
    fields: dict[str, str] = {}
    paths: list[str] = []
    dists: list[str] = []
    complete = False
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if key == "path":
            paths.append(value)
        elif key == "dist":
            dists.append(value)
        elif key == "end":
            complete = True
        elif key:
            fields[key] = value
    if not complete or not fields.get("executable"):
        return None  # a process killed while writing: its interpreter is another's or unknown
    return {"fields": fields, "paths": paths, "dists": dists, "started": started}


def read_hook_records(directory: Path) -> list[dict[str, Any]]:
    """Every interpreter the hook recorded in *directory*, first started first."""
    parsed = [p for p in (_parse_hook_file(f) for f in sorted(Path(directory).glob(_HOOK_FILE_GLOB))) if p]
    parsed.sort(key=lambda p: p["started"])
    out = []
    for item in parsed:
        fields = item["fields"]
        prefix, base = fields.get("prefix"), fields.get("base_prefix")
        out.append({
            "executable": fields["executable"],
            "version": fields.get("version"),
            "implementation": fields.get("implementation"),
            "prefix": prefix,
            "virtualenv": bool(prefix and base and prefix != base),
            "platform": fields.get("platform"),
            "sys_path": item["paths"],
            "distributions": env_facet.read_distributions(item["dists"]),
        })
    return out


def program_record(program: str, workdir: Path, path_env: str | None) -> dict[str, Any]:
    """A command that is not Python: its program's path and digest (exact, where a version string
    would be a guess), and the interpreter a script's ``#!`` line names.  The program is not run
    to ask its version: a wrapped script may ignore ``--version`` and start the experiment."""
    found = program if os.sep in program else shutil.which(program, path=path_env) or program
    path = (workdir / found) if not os.path.isabs(found) else Path(found)
    record: dict[str, Any] = {"path": str(path), "sha256": None, "shebang": None}
    try:
        record["sha256"] = file_digest(path)
        with path.open("rb") as handle:
            head = handle.read(256)
        if head.startswith(b"#!"):
            record["shebang"] = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    except OSError as err:
        record["unreadable"] = err.strerror or type(err).__name__
    return record


def document(interpreters: list[dict[str, Any]], program: dict[str, Any] | None) -> dict[str, Any]:
    """``repeats/<k>/interpreters.json``."""
    return {"schema": SCHEMA, "interpreters": interpreters, "program": program}


NO_LOCK = "no lock applies: the command started no Python process (or only with python -I/-E, which skip repro500's hook)"


def command_environment(recorded: dict[str, Any], tool: dict[str, Any]) -> dict[str, Any]:
    """The environment facet of a wrapped command: the interpreter its first Python process ran
    (every other one listed under ``interpreters``), or its program when none ran.  *tool* is the
    facet as repro500's own interpreter saw it: its ``os`` and ``env`` are the command's too (the
    same machine, the environment the command was given); its Python and distributions are kept
    as ``tool``, the tool's, not the experiment's."""
    interpreters = recorded.get("interpreters") or []
    facet: dict[str, Any] = {"os": tool.get("os"), "env": tool.get("env")}
    tool_python = tool.get("python") or {}
    facet["tool"] = {"python": {k: tool_python.get(k) for k in ("version", "executable", "prefix")},
                     "distributions": len(tool.get("distributions") or [])}
    if not interpreters:
        facet.update(python=None, distributions=[], torch_build={"installed": False},
                     program=recorded.get("program"), lock=NO_LOCK, recorded_from="the command's program")
        return facet
    main = interpreters[0]
    dists = main["distributions"]
    versions = {env_facet.normalize(d["name"]): d["version"] for d in dists}
    torch_dir = next((Path(p) / "torch" for p in main.get("sys_path") or []
                      if (Path(p) / "torch" / "__init__.py").is_file()), None)
    facet.update(
        python={"version": main.get("version"), "implementation": _implementation(main.get("implementation")),
                "executable": main["executable"], "prefix": main.get("prefix"),
                "virtualenv": main.get("virtualenv")},
        distributions=dists,
        torch_build=env_facet.torch_build(versions, torch_dir) if torch_dir else {"installed": False},
        recorded_from="the command's Python processes",
    )
    if len(interpreters) > 1:  # a launcher's Python and its workers' another, say
        facet["interpreters"] = [{"executable": i["executable"], "version": i.get("version"),
                                  "prefix": i.get("prefix"), "distributions": i["distributions"]}
                                 for i in interpreters[1:]]
    return facet


def _implementation(name: str | None) -> str | None:
    # platform.python_implementation()'s spelling, which the tool's own record uses
    return {"cpython": "CPython", "pypy": "PyPy"}.get(name or "", name)
