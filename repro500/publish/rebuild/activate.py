"""The rebuilt venv as the rerun sees it: activated, as ``source bin/activate`` would leave it."""

from __future__ import annotations

import os
from pathlib import Path


def activated(env_python: Path, environ: dict[str, str]) -> dict[str, str]:
    """*environ* as a venv's activation leaves it: its bin first on PATH (a command's ``python``)."""
    bin_dir = str(env_python.parent.resolve())
    out = {k: v for k, v in environ.items() if k not in ("PYTHONHOME", "CONDA_PREFIX")}
    out["PATH"] = os.pathsep.join([bin_dir, *(p for p in environ.get("PATH", "").split(os.pathsep) if p)])
    out["VIRTUAL_ENV"] = str(env_python.parent.parent.resolve())
    return out
