"""The ``toolchain`` facet: the compilers and CUDA toolkit that build custom operators.

repro500 compiles its compressor operators at run time (``repro500.ext.build``): the CPU
kernels with the C++ compiler torch's JIT build uses (``$CXX``, else ``c++``), the CUDA
kernels with the toolkit's ``nvcc``.  A different compiler can change those kernels, so the
versions are recorded, as ``python -m torch.utils.collect_env`` reports them.

Fast by construction: the CUDA toolkit's version is read from its ``version.json`` (or the
older ``version.txt``); only without one is ``nvcc --version`` run.  The ``--version``
probes all start at once and share one short deadline.  A tool that is not installed is
recorded with ``executable: null``; one that hangs or fails has ``version: null`` and says why.
Neither is an error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from repro500.capture.registry import CaptureContext, facet

DEADLINE_S = 2.0
# name -> command; "cxx" is the compiler torch.utils.cpp_extension runs
TOOLS = ("cxx", "gcc", "g++", "clang", "cmake")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")
# "Cuda compilation tools, release 13.0, V13.0.88"
_NVCC_VERSION = re.compile(r"\bV(\d+\.\d+(?:\.\d+)*)")
_NVCC_RELEASE = re.compile(r"\brelease (\d+\.\d+(?:\.\d+)*)")


def _command(name: str) -> str:
    return os.environ.get("CXX", "c++") if name == "cxx" else name


def parse_version(line: str) -> str | None:
    """``"gcc (Debian 12.2.0-14) 12.2.0"`` -> ``"12.2.0"``; the number after "version" if any."""
    _, found, rest = line.partition("version")
    match = _VERSION.search(rest if found else line)
    return match.group(0) if match else None


def cuda_version_from_files(home: Path) -> tuple[str | None, str | None, str | None]:
    """``(nvcc version, toolkit release, file read)`` from a toolkit root, without running nvcc.

    ``version.json`` (CUDA >= 11.1) gives both the ``cuda_nvcc`` component version (what
    ``nvcc --version`` prints after ``V``) and the toolkit release; ``version.txt`` (older
    toolkits) gives ``CUDA Version 10.2.89``, which is nvcc's version too.
    """
    try:
        info = json.loads((home / "version.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict):
        nvcc = (info.get("cuda_nvcc") or {}).get("version")
        release = (info.get("cuda") or {}).get("version")
        if nvcc or release:
            return nvcc or release, release, "version.json"
    try:
        text = (home / "version.txt").read_text(encoding="utf-8")
    except OSError:
        return None, None, None
    match = re.search(r"CUDA Version\s+(\S+)", text)
    return (match.group(1), None, "version.txt") if match else (None, None, None)


def _start(argv: list[str]) -> subprocess.Popen[str] | str:
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace")
    except OSError as err:
        return f"cannot run: {err.strerror or type(err).__name__}"


def _finish(proc: subprocess.Popen[str] | str, deadline: float) -> tuple[str | None, str | None]:
    """``(output, problem)`` of a started probe, killing it at the shared deadline."""
    if isinstance(proc, str):
        return None, proc
    try:
        out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, f"no answer within {DEADLINE_S:g} s"
    if proc.returncode != 0:
        return None, f"exited with status {proc.returncode}"
    return out, None


def find_cuda_home() -> str | None:
    """The CUDA toolkit root (the one repro500's CUDA build uses, so the record names it): $CUDA_HOME, else /usr/local/cuda, else the parent of nvcc's dir."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        # Resolve wrapper scripts and symlinks: torch needs the directory with include/.
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for root in candidates:
        if root and (Path(root) / "bin" / "nvcc").exists() and (Path(root) / "include").is_dir():
            return root
    return None


def toolchain(deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    """The facet's data: ``{"cuda_toolkit": {...}, "tools": [{"name", "command", ...}]}``."""
    home = find_cuda_home()
    cuda: dict[str, Any] = {"home": home, "nvcc": None, "version": None, "release": None,
                            "version_from": None, "nvcc_on_path": shutil.which("nvcc")}
    probes: dict[str, subprocess.Popen[str] | str] = {}
    if home is not None:
        cuda["nvcc"] = str(Path(home) / "bin" / "nvcc")
        cuda["version"], cuda["release"], cuda["version_from"] = cuda_version_from_files(Path(home))
        if cuda["version"] is None:
            probes["nvcc"] = _start([cuda["nvcc"], "--version"])
    tools = []
    for name in TOOLS:
        command = _command(name)
        executable = shutil.which(command)
        # "executable", not "path": repro500 diff keys records by a "path" before a "name"
        tools.append({"name": name, "command": command, "executable": executable,
                      "version": None, "version_line": None})
        if executable is not None:
            probes[name] = _start([executable, "--version"])
    deadline = time.monotonic() + deadline_s
    answers = {name: _finish(proc, deadline) for name, proc in probes.items()}
    if "nvcc" in answers:
        out, problem = answers["nvcc"]
        match = _NVCC_VERSION.search(out or "")
        release = _NVCC_RELEASE.search(out or "")
        cuda["version"] = match.group(1) if match else None
        cuda["release"] = release.group(1) if release else None
        cuda["version_from"] = "nvcc --version"
        if problem or not match:
            cuda["problem"] = problem or "no version in nvcc's output"
    for tool in tools:
        if tool["name"] not in answers:
            continue
        out, problem = answers[tool["name"]]
        first = next((line.strip() for line in (out or "").splitlines() if line.strip()), None)
        tool["version"] = parse_version(first) if first else None
        tool["version_line"] = first
        if problem or tool["version"] is None:
            tool["problem"] = problem or "no version in its --version output"
    return {"cuda_toolkit": cuda, "tools": tools}


@facet("toolchain")
def toolchain_facet(ctx: CaptureContext) -> dict[str, Any]:
    return toolchain()
