"""Which installer rebuilds the environment, and its command line.

uv (https://docs.astral.sh/uv/) installs when it is here — on PATH, beside this interpreter (a
venv's ``bin/`` that is not on PATH), or the ``uv`` package's binary — its cache making a second
rebuild a matter of links; pip otherwise, run from this interpreter against the new venv
(``--python``).  ``REPRO500_INSTALLER=uv|pip`` forces one (pip: uv is not used at all).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from repro500 import untrusted
from repro500.errors import InvalidInput, UsageError

INSTALLER_ENV = "REPRO500_INSTALLER"
INSTALLERS = ("uv", "pip")


def uv_binary() -> str | None:
    """uv's executable: on PATH, else beside this interpreter (repro500 run as ``.venv/bin/repro500``
    with that venv not on PATH), else the ``uv`` package's own binary."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def installer() -> str:
    """``uv`` or ``pip``: ``REPRO500_INSTALLER`` when set, else uv when it is here."""
    forced = os.environ.get(INSTALLER_ENV, "").strip()
    if forced and forced not in INSTALLERS:
        raise UsageError(f"{INSTALLER_ENV}={untrusted.shown(forced)[:40]!r}: choose uv or pip, or leave it unset "
                         "to use uv when it is here and pip otherwise")
    if forced == "pip":
        return "pip"
    if uv_binary():
        return "uv"
    if forced == "uv":
        raise InvalidInput(f"{INSTALLER_ENV}=uv but no uv is here (not on PATH, not beside {sys.executable}, "
                           "no uv package): install uv, or unset it to rebuild with pip")
    return "pip"


def install_cmd(env_python: Path, find_links: list[Path], indexes: list[str] | None = None) -> list[str]:
    """The installer's command line, up to its requirements (no shell, no lock text in it).  The
    indexes are the installer's own configuration (the reproducer's) and *indexes*, those the
    reproducer named with ``--index``: never one because the lock names it."""
    if installer() == "uv":
        cmd = [uv_binary() or "uv", "pip", "install", "--python", str(env_python), "--no-deps"]
        # uv asks each index in turn; the PyTorch index comes first for torch's local builds
        cmd += ["--index-strategy", "unsafe-best-match"] if indexes else []
    else:
        cmd = [sys.executable, "-m", "pip", "--python", str(env_python), "install", "--no-deps",
               "--disable-pip-version-check", "--no-input"]
    for url in indexes or []:
        cmd += ["--extra-index-url", url]
    for folder in find_links:
        cmd += ["--find-links", str(folder)]
    return cmd
