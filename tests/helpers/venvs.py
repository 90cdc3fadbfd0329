"""Other people's environments for the rebuild tests: a venv (not repro500's) holding wheels from a
local folder, installed by pip for real, and a PATH that puts its interpreter first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def venv_with(venv: Path, wheels: Path, *requirements: str) -> Path:
    """A venv at *venv* (no pip of its own) with *requirements* installed by name from the wheel
    folder *wheels*, as from an index (a wheel file given by path would be an archive install)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-index", "--find-links", str(wheels), *requirements],
                   check=True, timeout=300, capture_output=True)
    return venv


def path_with(bin_dir: Path) -> dict[str, str]:
    """An environment whose PATH finds *bin_dir*'s programs (``python``) first."""
    return {"PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
