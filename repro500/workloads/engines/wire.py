"""Bytes a rank actually put on the wire, from the kernel's TCP counters.

The communicators count payload bytes with the ring / allgather formulas (a model: see
:mod:`repro500.ext.communicator`).  This module measures instead: the sum of ``bytes_sent``
and ``bytes_received`` over every TCP socket of this process, as the kernel's ``tcp_info``
reports them (``ss -tinp``, from iproute2).  That is everything the rank exchanged: Gloo's
gradient collectives with their framing, DDP's buffer broadcasts, the trainer's small
collectives and the rendezvous store; NCCL over NVLink or InfiniBand verbs bypasses TCP and is
not seen.  Sockets closed between two readings drop out of the sum, so only differences
between readings taken while the process group is up are meaningful.

The trainer reads the counters at the start and end of each epoch's training steps on every
rank (one ``ss`` call each, a few milliseconds) and gathers them on rank 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

_SENT = re.compile(r"\bbytes_sent:(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def parse_ss(text: str, pid: int) -> tuple[int, int]:
    """(sent, received) summed over the sockets of *pid* in ``ss -tinpH`` output.

    ``ss -i`` prints each socket on one line (its ``users:(("python",pid=N,fd=M))``) and its
    ``tcp_info`` on the next, indented; a socket may be shared by several processes.
    """
    sent = received = 0
    mine = False
    owner = re.compile(rf"\bpid={pid},")
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            mine = bool(owner.search(line))
            continue
        if mine:
            sent += sum(int(v) for v in _SENT.findall(line))
            received += sum(int(v) for v in _RECEIVED.findall(line))
    return sent, received


def tcp_bytes(pid: int | None = None, timeout_s: float = 10.0) -> tuple[int, int] | None:
    """(sent, received) over every TCP socket of *pid* (default: this process); None when
    ``ss`` is not installed or fails (the measurement is then simply absent)."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    try:
        out = subprocess.run([ss, "-tinpH"], capture_output=True, text=True, check=False,
                             timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return parse_ss(out.stdout, os.getpid() if pid is None else pid)
