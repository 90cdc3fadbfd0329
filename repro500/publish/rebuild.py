"""``reproduce --env venv``: the publication's locked environment, rebuilt in ``OUT/env``.

The lock (``environment.lock.json`` in the packed run, capture/lock.py) is untrusted input: it is
read through :mod:`repro500.untrusted`, and nothing in it is executed or handed to a shell.  Each
requirement the installer gets is rebuilt here from checked parts (a PEP 508 name, a version of
plain characters, an https URL and a 40-hex commit), never taken from the lock's own text; an
index must be https; the experiment's own package is installed only from a path inside
``OUT/source``.  A lock that breaks any of these is refused with one sentence (exit 4).

Building the environment runs code the publication chose (a source distribution's build backend,
a wheel's ``.pth`` file at every start of the venv's Python): it is asked of
:func:`repro500.untrusted.consent` (``--run-code``) by :func:`check_mode`, before anything is
written.  The packages come from the reproducer's own indexes (what ``PIP_INDEX_URL``/
``UV_DEFAULT_INDEX`` and their extra-index variables name, else the installer's default); an
index the lock names is asked only when the reproducer names it too (``--index URL``): a
publisher's index would otherwise serve every pin, and the build tools the installer fetches.

The build, in order:

1. the recorded Python ``major.minor`` found here (``pythonX.Y`` on PATH, this interpreter, or
   uv's managed Pythons), else exit 4 naming both versions: never a silent rebuild on another;
   then every pin whose recorded wheel tags (capture/lock.py) this Python cannot install here,
   named in one sentence with both platforms (exit 4): a lock from macOS arm64 on Linux x86_64
   fails before anything is created, not after minutes of resolving;
2. a plan line: the installer, the Python, how many distributions, from which indexes (the
   reproducer's; an index of the lock's named with ``--index`` and the pins it serves; the lock's
   indexes not asked), and how much the installer will download: each ``name==version`` asked of
   its index's PEP 691 JSON page (PEP 700 sizes), the file picked as the installer would pick it
   here; an index that is unreachable or answers no JSON makes the size unknown, never fails the
   rebuild.  Every distribution built from source here (an sdist the index serves, a VCS or
   archive pin, the experiment's own package) is named: its build code runs;
3. ``OUT/env`` created, then every pin resolved against its index without installing
   (``--dry-run``): a distribution no index serves is named in one sentence (exit 4), with
   ``--env current`` and ``--find-links DIR`` as the two ways on;
4. the pins installed (``--no-deps``: the lock is the whole closure), the experiment's own
   package from ``OUT/source``, and — for a built-in recipe, which runs inside repro500 —
   the repro500 running now;
5. ``OUT/env/.repro500-built`` written last, holding the lock's digest: a rebuild interrupted
   before it is found unfinished next time and redone from scratch; a finished one for the same
   lock is reused as it is.

uv (https://docs.astral.sh/uv/) installs when it is here — on PATH, beside this interpreter (a
venv's ``bin/`` that is not on PATH), or the ``uv`` package's binary — its cache making a second
rebuild a matter of links; pip otherwise, run from this interpreter against the new venv
(``--python``).  ``REPRO500_INSTALLER=uv|pip`` forces one (pip: uv is not used at all).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from packaging.tags import Tag, compatible_tags, cpython_tags, parse_tag, sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from repro500 import untrusted
from repro500.capture.env import DIRECT_URL
from repro500.capture.lock import PYPI, run_platform
from repro500.errors import InvalidInput, UsageError
from repro500.progress import human_bytes
from repro500.publish import index
from repro500.publish.datafiles import safe_relpath
from repro500.redact import redact_url
from repro500.rundir import layout, names

ENV_DIR = "env"
MARKER = names.ENV_MARKER
MODES = ("current", "venv")
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,200}[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9.+!_-]{1,100}$")
_PY_VERSION = re.compile(r"^(\d{1,2})\.(\d{1,3})\.(\d{1,3})[A-Za-z0-9]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_URL = re.compile(r"^https://[A-Za-z0-9.-]+(?::\d+)?/[A-Za-z0-9._~/%+=,-]*$")
_TAG = re.compile(r"^[A-Za-z0-9_.]{1,64}-[A-Za-z0-9_.]{1,64}-[A-Za-z0-9_.]{1,300}$")
INSTALLER_ENV = "REPRO500_INSTALLER"
INSTALLERS = ("uv", "pip")
_INDEX_ARG = re.compile(r"^https?://[^\s/]+(?:/\S*)?$")
# what building a publication's environment runs of its choosing: the consent's sentence names it
BUILD_RUNS = ("chooses code that runs when --env venv builds its environment (a pinned source distribution's "
              "build backend, a wheel's .pth file at every start of the venv's Python)")
_MISSING = re.compile(r"(?:No matching distribution found for|Because|because)\s+([A-Za-z0-9._-]+)\s*(?:==|was not found)")


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


def read(reference: Path, source: Path | None, hashes: Path | None = None) -> Pins:
    """The checked pins of the packed run's lock (*source*: ``OUT/source``, where its own package is;
    *hashes*: the publication's ``environment.hashes.json``, when it has one)."""
    path = reference / layout.LOCK
    try:
        raw = untrusted.read_bytes(path, "the environment lock")
    except FileNotFoundError:
        raise InvalidInput("this publication has no environment lock (it predates them): reproduce it with "
                           "--env current") from None
    doc = untrusted.load_json(raw, str(path))
    if not isinstance(doc, dict) or doc.get("schema") != "repro500/environment-lock/v1":
        raise InvalidInput(f"{path} is not a repro500/environment-lock/v1 document")
    if not doc.get("applies"):
        raise InvalidInput(f"the publication's run has no Python environment to rebuild ({untrusted.shown(doc.get('why'))}): "
                           "reproduce it with --env current")
    python = str((doc.get("python") or {}).get("version") or "")
    if not _PY_VERSION.match(python):
        raise InvalidInput(f"the environment lock's Python version {untrusted.shown(python)!r} is not a version")
    index = doc.get("index") or {}
    main = index.get("url")
    main = _checked_url(main, "the index") if main and "[REDACTED]" not in str(main) else None
    extra = [_checked_url(u, "an index") for u in index.get("extra") or [] if "[REDACTED]" not in str(u)]
    requirements, own, editable, unpinnable, from_source = [], [], set(), [], []
    released: list[tuple[str, str, str | None]] = []
    judged: dict[str, list[str]] = {}
    for entry in doc.get("distributions") or []:
        if not isinstance(entry, dict):
            raise InvalidInput("the environment lock's distributions must be objects")
        name, version = str(entry.get("name")), str(entry.get("version"))
        if not _NAME.match(name) or not _VERSION.match(version):
            raise InvalidInput(f"the environment lock names {untrusted.shown(name)[:80]!r} "
                               f"{untrusted.shown(version)[:40]!r}, which is not a distribution name and version")
        kind = entry.get("kind")
        if kind == "tool":
            continue
        tags = _checked_tags(doc.get("wheel_tags"), name)
        if kind in ("index", "archive") and entry.get("requirement") and tags and not _built_here(tags):
            judged[name] = tags  # a vcs or local install is built from source here: its tags do not bind
        if kind == "index" and entry.get("requirement"):
            url = None
            if entry.get("index"):
                url = _checked_url(entry["index"], "an index")
                if url not in extra:
                    extra.append(url)
            requirements.append(f"{name}=={version}")
            released.append((name, version, url))
        elif kind == "vcs" and entry.get("requirement"):
            commit = str(entry.get("commit") or "")
            if not _COMMIT.match(commit):
                raise InvalidInput(f"the environment lock's commit for {name} is not a 40-hex commit")
            requirements.append(f"{name} @ git+{_checked_url(entry.get('url'), 'a repository')}@{commit}")
            from_source.append(f"{name} (git)")
        elif kind == "archive" and entry.get("requirement"):
            url = _checked_url(entry.get("url"), "an archive")
            requirements.append(f"{name} @ {url}")
            if not urlsplit(url).path.endswith(".whl"):
                from_source.append(f"{name} (archive)")
        elif kind == "local" and entry.get("experiment"):
            rel = safe_relpath(entry.get("source_path"), f"the source path of {name}")
            if source is None or not (source / rel).resolve().is_relative_to(source.resolve()) \
                    or not (source / rel).is_dir():
                unpinnable.append(f"{name} {version}: the experiment's own package, not in the publication's source/")
                continue
            own.append((name, source / rel))
            if entry.get("editable"):
                editable.add(name)
        else:
            unpinnable.append(f"{name} {version}: {untrusted.shown(entry.get('why') or 'not pinned')[:200]}")
    digest = hashlib.sha256(raw).hexdigest()
    pins = Pins(python, requirements, main, extra, own, editable, unpinnable, digest,
                released, judged, _recorded_platform(doc), from_source=from_source)
    if hashes is not None and hashes.is_file():
        pins.hashes = read_hashes(hashes, digest, {name: version for name, version, _ in released})
    return pins


HASHES_SCHEMA = "repro500/release-hashes/v1"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


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


# ----- the interpreter and the installer ---------------------------------------------------------
def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def find_python(wanted: str) -> str:
    """An interpreter of the recorded ``major.minor`` here; InvalidInput naming both versions."""
    minor = _minor(wanted)
    candidates = [sys.executable, shutil.which(f"python{minor}") or ""]
    uv = _uv() if installer() == "uv" else None
    if uv:
        found = subprocess.run([uv, "python", "find", minor], capture_output=True, text=True, timeout=60, check=False)
        candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    for candidate in (c for c in candidates if c):
        if _minor(_version_of(candidate) or "") == minor:
            return candidate
    here = _version_of(sys.executable) or "unknown"
    raise InvalidInput(f"the publication's environment needs Python {minor} ({wanted}) and this machine has "
                       f"Python {_minor(here)} ({sys.executable}; no python{minor} on PATH): install Python "
                       f"{minor}, or reproduce with --env current")


def _uv() -> str | None:
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
    if _uv():
        return "uv"
    if forced == "uv":
        raise InvalidInput(f"{INSTALLER_ENV}=uv but no uv is here (not on PATH, not beside {sys.executable}, "
                           "no uv package): install uv, or unset it to rebuild with pip")
    return "pip"


def _install_cmd(env_python: Path, pins: Pins, find_links: list[Path], indexes: list[str] | None = None) -> list[str]:
    """The installer's command line, up to its requirements (no shell, no lock text in it).  The
    indexes are the installer's own configuration (the reproducer's) and *indexes*, those the
    reproducer named with ``--index``: never one because the lock names it."""
    if installer() == "uv":
        cmd = [_uv() or "uv", "pip", "install", "--python", str(env_python), "--no-deps"]
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


# ----- which index serves what ---------------------------------------------------------------------
def _bare(url: str) -> str:
    """*url* as an index's identity: no credentials, no trailing slash, the host in lower case."""
    parts = urlsplit(url.strip())
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}{port}{parts.path.rstrip('/')}"


_TRUE = ("1", "true", "yes", "on")


def configured_indexes(environ: dict[str, str] | None = None) -> list[str]:
    """The reproducer's own indexes as the installer in use reads them from the environment, the
    main one first; PyPI (the installer's default) when none is named; none under ``PIP_NO_INDEX``
    / ``UV_NO_INDEX``."""
    environ = dict(os.environ) if environ is None else environ
    if installer() == "uv":
        none = environ.get("UV_NO_INDEX", "")
        main = environ.get("UV_DEFAULT_INDEX") or environ.get("UV_INDEX_URL")
        extra = " ".join(environ.get(k, "") for k in ("UV_INDEX", "UV_EXTRA_INDEX_URL"))
    else:
        none = environ.get("PIP_NO_INDEX", "")
        main = environ.get("PIP_INDEX_URL")
        extra = environ.get("PIP_EXTRA_INDEX_URL", "")
    if none.strip().lower() in _TRUE:
        return []
    return list(dict.fromkeys([(main or PYPI).strip(), *extra.split()]))


@dataclass
class Serving:
    """Which index serves what in a rebuild: the reproducer's own indexes, the lock's indexes the
    reproducer named with ``--index`` too, and the lock's indexes asked of nobody."""

    mine: list[str]  # the reproducer's configured indexes, main first
    named: list[str]  # --index: handed to the installer
    pins_of: dict[str, list[str]]  # the lock's per-pin index -> the pins it names it for
    unused: list[str]  # the lock's indexes that are neither the reproducer's nor named

    def asked(self) -> list[str]:
        seen = {_bare(u) for u in self.mine}
        return [*self.mine, *(u for u in self.named if _bare(u) not in seen)]

    def indexes_for(self, own: str | None) -> list[str]:
        """The indexes a released pin is sized from: the one the lock names for it first, when it
        is asked at all, then every asked one."""
        asked = self.asked()
        if own and _bare(own) in {_bare(u) for u in asked}:
            return [own, *(u for u in asked if _bare(u) != _bare(own))]
        return asked

    def _pins(self, url: str) -> str:
        names = self.pins_of.get(_bare(url), [])
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f" (the lock names it for {shown})" if names else ""

    def text(self) -> str:
        """The plan line's part after "N pinned distributions": which indexes serve them."""
        out = f"from {', '.join(redact_url(u) for u in self.mine)}" if self.mine else "from no index (yours say none)"
        extra = [u for u in self.named if _bare(u) not in {_bare(m) for m in self.mine}]
        if extra:
            out += f" and, as --index names, {', '.join(redact_url(u) + self._pins(u) for u in extra)}"
        return out

    def not_asked(self) -> str:
        """The plan line's note of the lock's indexes that are not asked, or nothing."""
        if not self.unused:
            return ""
        return (f"; not asked: the lock's {', '.join(redact_url(u) + self._pins(u) for u in self.unused)}, not an "
                "index of yours (--index URL asks it)")


def serving(pins: Pins, named: list[str] | None = None, environ: dict[str, str] | None = None) -> Serving:
    """Which index serves what when *pins* are rebuilt here (see the module docstring)."""
    mine, named = configured_indexes(environ), list(named or [])
    yours = {_bare(u) for u in [*mine, *named]}
    pins_of: dict[str, list[str]] = {}
    for name, _, url in pins.released:
        if url:
            pins_of.setdefault(_bare(url), []).append(name)
    lock = [u for u in [pins.index, *pins.extra_indexes] if u]
    unused = list(dict.fromkeys(u for u in lock if _bare(u) not in yours))
    return Serving(mine, named, pins_of, unused)


# ----- what fits here, and what it costs to download ---------------------------------------------


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
                       f"with Python {_minor(pins.python)}: {named}; reproduce with --env current "
                       f"(nothing was installed)")


@dataclass
class Download:
    """What the installer will fetch for the pinned releases (the plan line)."""

    bytes_from_indexes: int = 0
    sized: int = 0  # pins whose file and size the index named
    local: int = 0  # pins a --find-links folder holds
    unknown: int = 0  # pins no index sized: unreachable, no JSON, no size, not served, or not a release
    sdists: list[str] = field(default_factory=list)  # "name version": the index serves no wheel that fits here

    def text(self) -> str:
        parts = []
        if self.sized:
            # the installer's cache is its own: what it already holds is not known here, only bounded
            parts.append(f", up to {human_bytes(self.bytes_from_indexes)} from the indexes "
                         "(what the installer's cache holds is not downloaded again)")
        if self.local:
            parts.append(f", {self.local} from --find-links")
        if self.unknown:
            parts.append(f"; download size unknown for {self.unknown} distributions")
        return "".join(parts)


def _chosen(files: list[dict[str, Any]], name: str, version: Version, rank: dict[Tag, int]) -> dict[str, Any] | None:
    """The file of *name* *version* the installer takes here: the compatible wheel whose best tag
    ranks first, else the sdist; None when the index has neither."""
    project = canonicalize_name(name)
    best: tuple[int, dict[str, Any]] | None = None
    sdist = None
    for entry in files:
        filename = entry["filename"]
        try:
            if filename.endswith(".whl"):
                found, found_version, _, tags = parse_wheel_filename(filename)
                score = min((rank[t] for t in tags if t in rank), default=None)
                if found == project and found_version == version and score is not None \
                        and (best is None or score < best[0]):
                    best = (score, entry)
            elif sdist is None:
                found, found_version = parse_sdist_filename(filename)
                if found == project and found_version == version:
                    sdist = entry
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue  # an egg, a .exe installer, a name that is not a distribution's: not what it takes
    return best[1] if best else sdist


def _local_releases(find_links: list[Path], rank: dict[Tag, int]) -> set[tuple[str, Version]]:
    """(name, version) of every installable file in the --find-links folders."""
    found = set()
    for folder in find_links:
        for path in folder.iterdir():
            try:
                if path.name.endswith(".whl"):
                    name, version, _, tags = parse_wheel_filename(path.name)
                    if not any(t in rank for t in tags):
                        continue
                else:
                    name, version = parse_sdist_filename(path.name)
            except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
                continue
            found.add((name, version))
    return found


def download_size(pins: Pins, tags: list[Tag], find_links: list[Path], served: Serving | None = None) -> Download:
    """How much the installer will fetch for the pins (see the module docstring, step 2), each
    asked of the indexes *served* says (default: the reproducer's own, no --index)."""
    rank = {t: i for i, t in enumerate(tags)}
    local = _local_releases(find_links, rank)
    pages = index.Pages()
    served = served or serving(pins)

    def size(pin: tuple[str, str, str | None]) -> int | str:
        name, text, own = pin
        try:
            version = Version(text)
        except InvalidVersion:
            return "unknown"
        if (canonicalize_name(name), version) in local:
            return "local"
        picked = pages.first(served.indexes_for(own), name, lambda files: _chosen(files, name, version, rank))
        if picked and not str(picked.get("filename", "")).endswith(".whl"):
            sdists.append(f"{name} {text}")  # no wheel fits here: the installer builds it, running its build backend
        value = (picked or {}).get("size")
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else "unknown"

    sdists: list[str] = []

    try:
        with ThreadPoolExecutor(max_workers=index.QUERY_THREADS) as pool:
            sizes = list(pool.map(size, pins.released))
    finally:
        pages.close()
    download = Download(unknown=len(pins.requirements) - len(pins.released),  # vcs and archive pins: not sized
                        sdists=sorted(sdists))
    for value in sizes:
        if value == "local":
            download.local += 1
        elif value == "unknown":
            download.unknown += 1
        else:
            download.sized += 1
            download.bytes_from_indexes += int(value)
    return download


def _tool_requirement() -> tuple[list[str], str]:
    """How to install the repro500 running now: from its directory when installed from one (an
    editable checkout), else its release from the index."""
    # run from a source checkout (python -m repro500.cli), the checkout's own repro500.egg-info comes
    # first on sys.path and has no install record: the installed one, which says where it came from, wins
    found = list(metadata.distributions(name="repro500"))
    dist = next((d for d in found if d.read_text(DIRECT_URL)), found[0] if found else metadata.distribution("repro500"))
    try:
        info = json.loads(dist.read_text(DIRECT_URL) or "{}")
    except json.JSONDecodeError:
        info = {}
    url = str(info.get("url") or "")
    if url.startswith("file://") and "dir_info" in info:
        from urllib.parse import unquote, urlparse

        folder = unquote(urlparse(url).path)
        return (["-e", folder] if (info.get("dir_info") or {}).get("editable") else [folder]), f"repro500 from {folder}"
    return [f"repro500=={dist.version}"], f"repro500 {dist.version}"


def _run(cmd: list[str], what: str, console: Any) -> subprocess.CompletedProcess[str]:
    console.print(f"  {what} ...", highlight=False)
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)


_HASH_MISMATCH = re.compile(r"do not match the hashes|hash mismatch", re.IGNORECASE)


def _mismatch_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = next((line for line in lines if "==" in line or "Hash mismatch" in line), lines[-1] if lines else "")
    return named[:300]


def _missing(stderr: str) -> str | None:
    found = _MISSING.search(stderr)
    return found.group(1) if found else None


def _install_pins(base: list[str], pins: Pins, env: Path, served: Serving, console: Any) -> None:
    """The pinned releases into *env*: first checked with ``--dry-run`` (a pin no index serves, or a
    file that no longer matches its recorded hash, leaves nothing behind), then installed."""
    req = env / "requirements.repro500.txt"
    hashed = pins.hashed_requirements()
    req.write_text("\n".join(hashed or pins.requirements) + "\n", encoding="utf-8")
    checked = _run([*base, "--dry-run", "-r", str(req)], "checking that the indexes serve every pin", console)
    if checked.returncode != 0:
        shutil.rmtree(env, ignore_errors=True)
        if _HASH_MISMATCH.search(checked.stderr):
            raise InvalidInput(f"a file the index serves now does not match the hashes recorded when the "
                               f"publication was made ({installer()}: {_mismatch_line(checked.stderr)}): it "
                               "changed since; reproduce with --env current (nothing was installed)")
        name = _missing(checked.stderr) or "a locked distribution"
        asked = ", ".join(redact_url(u) for u in served.asked())
        lock = (f", or name the lock's index with --index {redact_url(served.unused[0])}"
                f"{' (or another it names)' if len(served.unused) > 1 else ''}" if served.unused else "")
        raise InvalidInput(f"{name} (pinned by the publication's lock) is served by no index reachable here "
                           f"({asked}): reproduce with --env current, or provide it with --find-links DIR{lock} "
                           f"(nothing was installed)")
    done = _run([*base, "-r", str(req)], f"installing {len(pins.requirements)} distributions", console)
    if done.returncode != 0 and _HASH_MISMATCH.search(done.stderr):
        raise InvalidInput(f"a file the index serves now does not match the hashes recorded when the publication "
                           f"was made ({installer()}: {_mismatch_line(done.stderr)}): it changed since; "
                           f"{env} is left unfinished and will be rebuilt next time; or reproduce with --env current")
    if done.returncode != 0:
        raise InvalidInput(f"installing the locked environment failed ({installer()}: "
                           f"{done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else 'no message'}); "
                           f"{env} is left unfinished and will be rebuilt next time; or reproduce with --env current")


def build(pins: Pins, out: Path, *, with_tool: bool, find_links: list[Path], console: Any,
          indexes: list[str] | None = None) -> Path:
    """``OUT/env`` holding the locked environment (see the module docstring); its Python.  The
    caller has the reproducer's consent (:func:`check_mode`); *indexes*: those named with ``--index``."""
    env = out / ENV_DIR
    env_python = env / "bin" / "python"
    marker = env / MARKER
    if marker.is_file() and untrusted.read_text(marker, "the environment's marker").strip() == f"{pins.digest} tool={with_tool}":
        console.print(f"environment: {env} already holds this publication's lock (rebuilt earlier); reusing it",
                      highlight=False, soft_wrap=True)
        return env_python
    python = find_python(pins.python)
    tags = target_tags(_minor(pins.python))
    check_fit(pins, tags)
    tool_args, tool_label = _tool_requirement() if with_tool else ([], "")
    served = serving(pins, indexes)
    left = f"; not installable, left out: {'; '.join(pins.unpinnable)}" if pins.unpinnable else ""
    own = f" + the experiment's own {', '.join(n for n, _ in pins.own)} from source/" if pins.own else ""
    download = download_size(pins, tags, find_links, served) if pins.requirements else Download()
    sized = download.text() if pins.requirements else ""
    if pins.requirements:
        sized += ("; every file checked against the hashes recorded at publication" if pins.hashed_requirements()
                  else "; files not checked against recorded hashes (the publication has none for every pin)")
    # what the installer builds from source here runs its build code: named, as --run-code consented to it
    built = [*(f"{n} (sdist)" for n in download.sdists), *pins.from_source,
             *(f"{n} (the experiment's own)" for n, _ in pins.own)]
    from_source = f"; built from source here, running their build code: {', '.join(built)}" if built else ""
    # names and versions from the publication's lock: shown, never markup
    console.print(untrusted.shown(f"environment: rebuilding in {env} with {installer()}: Python {_minor(pins.python)} "
                                  f"({python}), {len(pins.requirements)} pinned distributions {served.text()}{sized}{own}"
                                  f"{' + ' + tool_label if with_tool else ''}{served.not_asked()}{left}"
                                  f"{from_source}"),
                  highlight=False, soft_wrap=True)
    if env.exists():  # an unfinished or another lock's rebuild is never taken for this one
        shutil.rmtree(env)
    created = _run([python, "-m", "venv", "--without-pip", str(env)], "creating the venv", console)
    if created.returncode != 0:
        raise InvalidInput(f"cannot create a venv with {python}: {created.stderr.strip()[-300:]}")
    base = _install_cmd(env_python, pins, find_links, indexes)
    if pins.requirements:
        _install_pins(base, pins, env, served, console)
    for name, folder in pins.own:
        args = ["-e", str(folder)] if name in pins.editable else [str(folder)]
        done = _run([*base, *args], f"installing the experiment's own {name} from {folder}", console)
        if done.returncode != 0:
            raise InvalidInput(f"installing the experiment's own package {name} from {folder} failed: "
                               f"{done.stderr.strip()[-300:]}")
    if with_tool:
        # repro500 itself, and the build tools its install may fetch, from the reproducer's indexes only
        done = _run([*_install_cmd(env_python, pins, find_links), *tool_args], f"installing {tool_label}", console)
        if done.returncode != 0:
            raise InvalidInput(f"installing {tool_label} into {env} failed: {done.stderr.strip()[-300:]}")
    marker.write_text(f"{pins.digest} tool={with_tool}\n", encoding="utf-8")  # last: the rebuild is complete
    return env_python


def check_mode(mode: str, find_links: list[str], *, run_code: bool, indexes: list[str] | None = None) -> list[Path]:
    """The ``--find-links`` folders, once the options of the environment are checked and, for
    ``--env venv``, the reproducer consented to the code its build runs; UsageError before
    anything is written otherwise."""
    if mode not in MODES:
        raise UsageError(f"--env {mode}: choose one of {', '.join(MODES)}")
    if find_links and mode != "venv":
        raise UsageError("--find-links serves a rebuilt environment: it goes with --env venv")
    if indexes and mode != "venv":
        raise UsageError("--index serves a rebuilt environment: it goes with --env venv")
    for url in indexes or []:
        if not _INDEX_ARG.match(url):
            raise UsageError(f"--index {untrusted.shown(redact_url(url))[:120]!r} is not an http(s) URL of a package index")
    if mode == "venv":
        installer()  # a bad or unmet REPRO500_INSTALLER stops the reproduction before anything is done
    folders = [Path(f) for f in find_links]
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--find-links {folder} is not a directory")
    if mode == "venv":
        untrusted.consent(run_code, BUILD_RUNS, review="its lock (environment.lock.json in the packed run)",
                          instead="reproduce with --env current")
    return [f.resolve() for f in folders]


def activated(env_python: Path, environ: dict[str, str]) -> dict[str, str]:
    """*environ* as a venv's activation leaves it: its bin first on PATH (a command's ``python``)."""
    bin_dir = str(env_python.parent.resolve())
    out = {k: v for k, v in environ.items() if k not in ("PYTHONHOME", "CONDA_PREFIX")}
    out["PATH"] = os.pathsep.join([bin_dir, *(p for p in environ.get("PATH", "").split(os.pathsep) if p)])
    out["VIRTUAL_ENV"] = str(env_python.parent.parent.resolve())
    return out
