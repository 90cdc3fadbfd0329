"""The Python the rebuilt venv is made with: the recorded ``major.minor`` found here
(``pythonX.Y`` on PATH, this interpreter, or uv's managed Pythons), else exit 4 naming both
versions: never a silent rebuild on another."""

from __future__ import annotations

import shutil
import subprocess
import sys

from repro500.errors import InvalidInput
from repro500.publish.rebuild.installer import installer, uv_binary
from repro500.publish.rebuild.lock import minor_version


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def find_python(wanted: str) -> str:
    """An interpreter of the recorded ``major.minor`` here; InvalidInput naming both versions."""
    minor = minor_version(wanted)
    candidates = [sys.executable, shutil.which(f"python{minor}") or ""]
    uv = uv_binary() if installer() == "uv" else None
    if uv:
        found = subprocess.run([uv, "python", "find", minor], capture_output=True, text=True, timeout=60, check=False)
        candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    for candidate in (c for c in candidates if c):
        if minor_version(_version_of(candidate) or "") == minor:
            return candidate
    here = _version_of(sys.executable) or "unknown"
    raise InvalidInput(f"the publication's environment needs Python {minor} ({wanted}) and this machine has "
                       f"Python {minor_version(here)} ({sys.executable}; no python{minor} on PATH): install Python "
                       f"{minor}, or reproduce with --env current")
