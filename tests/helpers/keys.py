"""OpenSSH signing keys made by the real ``ssh-keygen``, and git's ``allowed_signers`` files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "openssh-client"], capture_output=True, timeout=300)
        found = shutil.which("ssh-keygen")
    if found is None:
        print("ssh-keygen is missing and openssh-client could not be installed")
        pytest.skip("ssh-keygen is missing and openssh-client could not be installed")
    return found


def make_key(directory: Path, name: str = "id", passphrase: str = "", kind: str = "ed25519") -> Path:
    path = directory / name
    subprocess.run([ssh_keygen(), "-q", "-t", kind, "-N", passphrase, "-C", name, "-f", str(path)],
                   check=True, capture_output=True)
    return path


def trust_line(key: Path, principal: str = "alice@example.org", options: str = 'namespaces="repro500"') -> str:
    pub = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    return f"{principal} {options} {pub}".replace("  ", " ")


def write_trust(directory: Path, *lines: str) -> Path:
    path = directory / "allowed_signers"
    path.write_text("\n".join(lines) + "\n")
    return path
