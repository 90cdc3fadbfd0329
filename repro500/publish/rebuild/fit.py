"""Whether the lock's wheels fit here: every pin whose recorded wheel tags (capture/lock.py) this
Python cannot install here is named in one sentence with both platforms (exit 4), so a lock from
macOS arm64 on Linux x86_64 fails before anything is created, not after minutes of resolving."""

from __future__ import annotations

import platform
import sys

from packaging.tags import Tag, compatible_tags, cpython_tags, parse_tag, sys_tags

from repro500.capture.lock import run_platform
from repro500.errors import InvalidInput
from repro500.publish.rebuild.lock import Pins, minor_version


def target_tags(minor: str) -> list[Tag]:
    """The wheel tags the rebuilt venv's Python accepts here, best first (the order an installer
    ranks wheels by): this interpreter's when it is that Python, else CPython's for *minor* on
    this machine's platforms."""
    if minor == f"{sys.version_info.major}.{sys.version_info.minor}":
        return list(sys_tags())
    version = tuple(int(part) for part in minor.split("."))
    return [*cpython_tags(version), *compatible_tags(version, interpreter=f"cp{''.join(map(str, version))}")]


def _misfit(recorded: list[str], accepted: set[Tag]) -> str:
    """The part of a pin's first recorded wheel tag that *accepted* lacks: its platform, or, on a
    platform that fits, its Python and ABI (``cp311-cp311``)."""
    wheel = parse_tag(recorded[0])
    if any(t.platform in {a.platform for a in accepted} for t in wheel):
        return ", ".join(sorted({f"{t.interpreter}-{t.abi}" for t in wheel}))
    return recorded[0].rsplit("-", 1)[-1]


def check_fit(pins: Pins, tags: list[Tag]) -> None:
    """InvalidInput naming every pin whose recorded wheels all have tags *tags* lacks."""
    accepted = set(tags)
    # each named with what of its wheel does not fit: its platform (the lock's own platform is
    # where the run was, and a wheel copied or cross-installed there can be another's), else the
    # Python tag that differs (cp311 wheels for a rebuild in Python 3.12)
    misfits = [f"{name} ({_misfit(recorded, accepted)[:60]})" for name, recorded in pins.wheel_tags.items()
               if not any(t in accepted for text in recorded for t in parse_tag(text))]
    if not misfits:
        return
    named = ", ".join(misfits[:5]) + (f" and {len(misfits) - 5} more" if len(misfits) > 5 else "")
    tag = run_platform()["tag"]
    raise InvalidInput(f"the publication's lock, recorded on {pins.platform}, holds wheels that this "
                       f"{platform.system()} {platform.machine()}{f' ({tag})' if tag else ''} machine cannot install "
                       f"with Python {minor_version(pins.python)}: {named}; reproduce with --env current "
                       f"(nothing was installed)")
