"""The publication's lock, read and checked: what the installer is asked for.

The lock (``environment.lock.json`` in the packed run, capture/lock.py) is untrusted input: it is
read through :mod:`repro500.untrusted`, and nothing in it is executed or handed to a shell.  Each
requirement the installer gets is rebuilt here from checked parts (a PEP 508 name, a version of
plain characters, an https URL and a 40-hex commit), never taken from the lock's own text; an
index must be https; the experiment's own package is installed only from a path inside
``OUT/source``.  A lock that breaks any of these is refused with one sentence (exit 4).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from repro500 import recorded_paths, untrusted
from repro500.capture.lock import PYPI
from repro500.errors import InvalidInput
from repro500.rundir import layout
from repro500.rundir.names import LOCK_SCHEMA

SCHEMA = LOCK_SCHEMA
HASHES_SCHEMA = "repro500/release-hashes/v1"
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,200}[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9.+!_-]{1,100}$")
_PY_VERSION = re.compile(r"^(\d{1,2})\.(\d{1,3})\.(\d{1,3})[A-Za-z0-9]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_URL = re.compile(r"^https://[A-Za-z0-9.-]+(?::\d+)?/[A-Za-z0-9._~/%+=,-]*$")
_TAG = re.compile(r"^[A-Za-z0-9_.]{1,64}-[A-Za-z0-9_.]{1,64}-[A-Za-z0-9_.]{1,300}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


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
    # (name, version, the index the lock names for it or None): what the plan line sizes
    released: list[tuple[str, str, str | None]] = field(default_factory=list)
    wheel_tags: dict[str, list[str]] = field(default_factory=dict)  # name -> recorded wheel tags, judged here
    platform: str = "a platform it does not name"  # the publisher's, as the lock records it
    # name -> sha256 of every file its index served for the pinned version when it was published
    hashes: dict[str, list[str]] = field(default_factory=dict)
    # "name (git)" / "name (archive)": pins the installer builds from source here, their build code running
    from_source: list[str] = field(default_factory=list)

    def indexes_for(self, own: str | None) -> list[str]:
        """The indexes a released pin is asked of: the one the lock names for it (torch's local
        builds), else the lock's index and the extra ones no pin owns."""
        if own:
            return [own]
        owned = {url for _, _, url in self.released if url}
        return [self.index or PYPI, *(u for u in self.extra_indexes if u not in owned)]

    def hashed_requirements(self) -> list[str] | None:
        """The requirements with ``--hash`` options, when every pin is a release whose hashes the
        publication recorded (installers check all pins or none); None otherwise."""
        if not self.hashes or len(self.released) != len(self.requirements) \
                or any(name not in self.hashes for name, _, _ in self.released):
            return None
        return [f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in self.hashes[name])
                for name, version, _ in self.released]


def minor_version(version: str) -> str:
    """``3.11`` of ``3.11.7``: what a rebuild must match (never a silent rebuild on another)."""
    return ".".join(version.split(".")[:2])


def read(reference: Path, source: Path | None, hashes: Path | None = None) -> Pins:
    """The checked pins of the packed run's lock (*source*: ``OUT/source``, where its own package is;
    *hashes*: the publication's ``environment.hashes.json``, when it has one)."""
    raw, doc = _document(reference / layout.LOCK)
    python = _python_version(doc)
    main, extra = _indexes(doc)
    pins = Pins(python, [], main, extra, [], set(), [], hashlib.sha256(raw).hexdigest(),
                platform=_recorded_platform(doc))
    for entry in doc.get("distributions") or []:
        _pin(pins, entry, doc.get("wheel_tags"), source)
    if hashes is not None and hashes.is_file():
        pins.hashes = read_hashes(hashes, pins.digest, {name: version for name, version, _ in pins.released})
    return pins


def _document(path: Path) -> tuple[bytes, dict[str, Any]]:
    """The lock's bytes and document, once it is a lock of a run that has an environment to rebuild."""
    try:
        raw = untrusted.read_bytes(path, "the environment lock")
    except FileNotFoundError:
        raise InvalidInput("this publication has no environment lock (it predates them): reproduce it with "
                           "--env current") from None
    doc = untrusted.load_json(raw, str(path))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InvalidInput(f"{path} is not a {SCHEMA} document")
    if not doc.get("applies"):
        raise InvalidInput(f"the publication's run has no Python environment to rebuild ({untrusted.shown(doc.get('why'))}): "
                           "reproduce it with --env current")
    return raw, doc


def _python_version(doc: dict[str, Any]) -> str:
    python = str((doc.get("python") or {}).get("version") or "")
    if not _PY_VERSION.match(python):
        raise InvalidInput(f"the environment lock's Python version {untrusted.shown(python)!r} is not a version")
    return python


def _indexes(doc: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The lock's main index and its extra ones; a redacted one (it held credentials) is left out."""
    named = doc.get("index") or {}
    main = named.get("url")
    main = _checked_url(main, "the index") if main and "[REDACTED]" not in str(main) else None
    return main, [_checked_url(u, "an index") for u in named.get("extra") or [] if "[REDACTED]" not in str(u)]


def _pin(pins: Pins, entry: Any, recorded_tags: Any, source: Path | None) -> None:
    """*entry*, one distribution of the lock, added to *pins* as the installer will get it."""
    if not isinstance(entry, dict):
        raise InvalidInput("the environment lock's distributions must be objects")
    name, version = str(entry.get("name")), str(entry.get("version"))
    if not _NAME.match(name) or not _VERSION.match(version):
        raise InvalidInput(f"the environment lock names {untrusted.shown(name)[:80]!r} "
                           f"{untrusted.shown(version)[:40]!r}, which is not a distribution name and version")
    kind, pinned = entry.get("kind"), bool(entry.get("requirement"))
    if kind == "tool":
        return
    tags = _checked_tags(recorded_tags, name)
    if kind in ("index", "archive") and pinned and tags and not _built_here(tags):
        pins.wheel_tags[name] = tags  # a vcs or local install is built from source here: its tags do not bind
    if kind == "index" and pinned:
        _pin_release(pins, entry, name, version)
    elif kind == "vcs" and pinned:
        commit = str(entry.get("commit") or "")
        if not _COMMIT.match(commit):
            raise InvalidInput(f"the environment lock's commit for {name} is not a 40-hex commit")
        pins.requirements.append(f"{name} @ git+{_checked_url(entry.get('url'), 'a repository')}@{commit}")
        pins.from_source.append(f"{name} (git)")
    elif kind == "archive" and pinned:
        url = _checked_url(entry.get("url"), "an archive")
        pins.requirements.append(f"{name} @ {url}")
        if not urlsplit(url).path.endswith(".whl"):
            pins.from_source.append(f"{name} (archive)")
    elif kind == "local" and entry.get("experiment"):
        _pin_own(pins, entry, name, version, source)
    else:
        pins.unpinnable.append(f"{name} {version}: {untrusted.shown(entry.get('why') or 'not pinned')[:200]}")


def _pin_release(pins: Pins, entry: dict[str, Any], name: str, version: str) -> None:
    """A release from an index; the index the lock names for it (torch's local builds) joins the extra ones."""
    url = None
    if entry.get("index"):
        url = _checked_url(entry["index"], "an index")
        if url not in pins.extra_indexes:
            pins.extra_indexes.append(url)
    pins.requirements.append(f"{name}=={version}")
    pins.released.append((name, version, url))


def _pin_own(pins: Pins, entry: dict[str, Any], name: str, version: str, source: Path | None) -> None:
    """The experiment's own package, installed from the publication's ``source/`` and nowhere else."""
    if source is None:
        pins.unpinnable.append(f"{name} {version}: the experiment's own package, not in the publication's source/")
        return
    text = entry.get("source_path")
    path = source if text == "." else recorded_paths.resolve(text, field=f"source_path of {name}",
                                                             file="the packed run's environment lock", root=source)
    if not path.is_dir():
        pins.unpinnable.append(f"{name} {version}: the experiment's own package, not in the publication's source/")
        return
    pins.own.append((name, path))
    if entry.get("editable"):
        pins.editable.add(name)


def _checked_url(value: Any, what: str) -> str:
    text = str(value or "")
    if not _URL.match(text):
        raise InvalidInput(f"the publication's environment lock names {what} {untrusted.shown(text)[:120]!r}, which "
                           "is not a plain https URL: refusing the lock (reproduce with --env current)")
    return text


def _checked_tags(recorded: Any, name: str) -> list[str]:
    tags = (recorded.get(name) if isinstance(recorded, dict) else None) or []
    if not isinstance(tags, list) or len(tags) > untrusted.MAX_WHEEL_TAGS \
            or not all(isinstance(t, str) and _TAG.match(t) for t in tags):
        raise InvalidInput(f"the environment lock's wheel tags for {name} are not wheel tags: refusing the lock "
                           "(reproduce with --env current)")
    return tags


def _built_here(tags: list[str]) -> bool:
    # PyPI accepts no plain linux_* wheel: one was built on the publisher's machine from an sdist,
    # which the installer can build again here, so its tag says nothing about what fits
    return any(t.rsplit("-", 1)[-1].startswith("linux_") for t in tags)


def _recorded_platform(doc: dict[str, Any]) -> str:
    recorded = doc.get("platform") if isinstance(doc.get("platform"), dict) else {}
    words = " ".join(untrusted.shown(recorded.get(k))[:40] for k in ("system", "machine") if recorded.get(k))
    tag = str(recorded.get("tag") or "")
    return f"{words or 'a platform it does not name'}{f' ({tag})' if re.fullmatch(r'[A-Za-z0-9_.]{1,100}', tag) else ''}"


def read_hashes(path: Path, lock_digest: str, versions: dict[str, str]) -> dict[str, list[str]]:
    """The checked release hashes a publication recorded for this lock's pins (untrusted input)."""
    doc = untrusted.load_json(untrusted.read_bytes(path, "the release hashes"), str(path))
    if not isinstance(doc, dict) or doc.get("schema") != HASHES_SCHEMA or doc.get("lock_sha256") != lock_digest:
        raise InvalidInput(f"{path} is not the release hashes of this publication's lock: refused")
    checked: dict[str, list[str]] = {}
    for name, entry in (doc.get("hashes") or {}).items():
        digests = entry.get("sha256") if isinstance(entry, dict) else None
        if name not in versions or entry.get("version") != versions[name] or not isinstance(digests, list) \
                or not digests or len(digests) > 1000 or not all(isinstance(d, str) and _HEX64.match(d) for d in digests):
            raise InvalidInput(f"{path} holds hashes for {untrusted.shown(name)[:80]!r} that do not fit the lock: refused")
        checked[name] = digests
    return checked
