"""repro500's own outputs, recognised by what they hold, wherever they lie and whatever they are named.

The experiment's source (``source/``, :mod:`repro500.capture.source`) must be the experiment's:
a run directory written by ``repro500 run --out results``, a publication in ``pub/``, a
reproduction in ``again/``, an MLflow store called ``lab.sqlite`` are repro500's (or MLflow's)
outputs, and they change with every run.  Their names are the user's choice, so they are told
apart by the files repro500 itself writes into them:

* a **run directory**: ``run.json`` of schema ``repro500/run/...``, or ``SHA256SUMS`` beside a
  ``manifest.json`` of schema ``repro500/manifest/...`` (an older run without ``run.json``);
* a **publication**: ``publication.json`` of schema ``repro500/publication/...``;
* a **reproduction**: a ``publication/`` subdirectory that is a publication, beside the
  reproduction's ``verdict.json`` (schema ``repro500/verdict/...``) or a ``runs/`` directory;
* an **MLflow tracking store**: a SQLite database holding MLflow's tables (``experiments``,
  ``runs``, ``metrics``, ``alembic_version``), with its side files (``-journal``, ``-wal``,
  ``-shm``, ``.lock``), and the **artifact roots** its experiments name;
* an **MLflow artifact root** of a store kept elsewhere: a directory holding
  ``<run-id>/artifacts/`` (an experiment's location) or ``<experiment-id>/<run-id>/artifacts/``
  (the root of several), run ids being MLflow's 32 hexadecimal digits;
* a **packed run** (``repro500 pack``): a ``.tar.gz`` whose members lie under one directory
  holding ``SHA256SUMS`` (pack writes them sorted, so it is among the first few).

Reading is cheap and never imports MLflow: a few ``stat`` calls per directory, a JSON read where
a marker file exists, the first 16 bytes of a file large enough to be an MLflow store, and a
read-only query of ``sqlite_master`` for one that is a SQLite database.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.rundir import layout

SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm", ".lock")  # as repro500.tracking.store names them
_SQLITE_MAGIC = b"SQLite format 3\x00"
_MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "alembic_version"})
_STORE_MIN_BYTES = 4096  # MLflow's schema alone takes dozens of pages: a smaller file is not its store
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_EXPERIMENT_ID = re.compile(r"^[0-9]+$")
_ARCHIVE = (".tar.gz", ".tgz")
_ARCHIVE_MEMBERS = 16


def _schema(path: Path, prefix: str) -> bool:
    """Whether ``path`` is a JSON object whose ``schema`` starts with ``prefix``."""
    try:
        # repro500's documents are small: one over the document cap (or a FIFO) is someone's data
        doc = untrusted.read_json(path, "a JSON document")
    except (OSError, InvalidInput):
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith(prefix)


def run_directory(path: Path) -> bool:
    if _schema(path / layout.RUN_JSON, "repro500/run/"):
        return True
    return (path / layout.SUMS_NAME).is_file() and _schema(path / layout.MANIFEST, "repro500/manifest/")


def publication(path: Path) -> bool:
    return _schema(path / layout.PUBLICATION_INDEX, "repro500/publication/")


def reproduction(path: Path) -> bool:
    if not publication(path / "publication"):
        return False
    return _schema(path / layout.VERDICT, "repro500/verdict/") or (path / "runs").is_dir()


def _holds_run_artifacts(path: Path) -> bool:
    try:
        return any(_RUN_ID.match(e.name) and e.is_dir() and os.path.isdir(os.path.join(e.path, "artifacts"))
                   for e in os.scandir(path))
    except OSError:
        return False


def mlflow_artifacts(path: Path) -> bool:
    """An experiment's artifact location (``<run-id>/artifacts``) or a root of several
    (``<experiment-id>/<run-id>/artifacts``)."""
    if _holds_run_artifacts(path):
        return True
    try:
        return any(_EXPERIMENT_ID.match(e.name) and e.is_dir() and _holds_run_artifacts(Path(e.path))
                   for e in os.scandir(path))
    except OSError:
        return False


def directory_kind(path: Path) -> str | None:
    """Which of repro500's (or MLflow's) outputs the directory ``path`` is, or None."""
    for kind, test in (("run", run_directory), ("publication", publication), ("reproduction", reproduction),
                       ("mlflow artifacts", mlflow_artifacts)):
        if test(path):
            return kind
    return None


def _tables(path: Path) -> set[str]:
    uri = f"file:{quote(str(path))}"
    for mode in ("?mode=ro", "?mode=ro&immutable=1"):  # immutable: a WAL store without a writable -shm
        try:
            conn = sqlite3.connect(uri + mode, uri=True, timeout=1)
        except sqlite3.Error:
            continue
        try:
            return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error:
            continue
        finally:
            conn.close()
    return set()


def mlflow_store(path: Path) -> bool:
    """Whether the file ``path`` is an MLflow tracking store (a SQLite database with its tables)."""
    try:
        if path.stat().st_size < _STORE_MIN_BYTES:
            return False
        with open(path, "rb") as fh:
            if fh.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                return False
    except OSError:
        return False
    return _tables(path) >= _MLFLOW_TABLES


def artifact_roots(store: Path) -> list[Path]:
    """The local artifact locations of an MLflow SQLite store's experiments (``file:`` URIs or
    paths; a server's ``mlflow-artifacts:`` and cloud URIs are elsewhere)."""
    if not mlflow_store(store):
        return []
    try:
        conn = sqlite3.connect(f"file:{quote(str(store))}?mode=ro", uri=True, timeout=1)
        try:
            rows = conn.execute("SELECT artifact_location FROM experiments").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    out = []
    for (location,) in rows:
        if not location:
            continue
        parsed = urlparse(location)
        if parsed.scheme in ("", "file"):
            raw = unquote(parsed.path) if parsed.scheme == "file" else location
            path = Path(raw) if os.path.isabs(raw) else store.parent / raw
            out.append(Path(os.path.abspath(path)))
    return out


def packed_run(path: Path) -> bool:
    """A ``repro500 pack`` archive: its first members lie under one directory holding SHA256SUMS."""
    if not path.name.endswith(_ARCHIVE):
        return False
    import tarfile

    try:
        with tarfile.open(path, "r:gz") as tar:
            tops, sums = set(), False
            for _ in range(_ARCHIVE_MEMBERS):
                member = tar.next()
                if member is None:
                    break
                top, _, rest = member.name.partition("/")
                tops.add(top)
                sums = sums or rest == layout.SUMS_NAME
            return sums and len(tops) == 1
    except (OSError, tarfile.TarError, EOFError):
        return False


class OwnOutputs:
    """Which files under ``root`` are repro500's own outputs, answered per path and remembered per
    directory (``root`` itself is the experiment, never an output)."""

    def __init__(self, root: Path, extra: Iterable[Path] = ()) -> None:
        self.root = Path(os.path.abspath(root))
        self._dirs: dict[Path, bool] = {}
        self._stores: dict[Path, bool] = {}
        self.skipped: set[Path] = {Path(os.path.abspath(p)) for p in extra}

    def directory(self, path: Path) -> bool:
        """Whether the directory ``path`` (under ``root``) is one of the outputs."""
        path = Path(os.path.abspath(path))
        if path == self.root:
            return False
        known = self._dirs.get(path)
        if known is None:
            known = path in self.skipped or directory_kind(path) is not None
            self._dirs[path] = known
        return known

    def _store(self, path: Path) -> bool:
        known = self._stores.get(path)
        if known is None:
            known = mlflow_store(path)
            self._stores[path] = known
            if known:  # its experiments' artifacts are MLflow's too, wherever they were put
                self.skipped.update(artifact_roots(path))
                self._dirs.clear()
        return known

    def inside(self, rel: str) -> bool:
        """Whether the file ``rel`` (relative to ``root``) lies inside an output directory."""
        parent, chain = (self.root / rel).parent, []
        while parent != self.root and parent.is_relative_to(self.root):
            chain.append(parent)
            parent = parent.parent
        return any(self.directory(d) for d in reversed(chain))

    def own_file(self, rel: str) -> bool:
        """Whether the file ``rel`` is itself an output: an MLflow store or one of its side files,
        or a packed run."""
        path = self.root / rel
        for side in SQLITE_SIDE_FILES:
            if path.name.endswith(side) and len(path.name) > len(side):
                base = path.with_name(path.name[: -len(side)])
                if base.is_file() and self._store(base):
                    return True
        return self._store(path) or packed_run(path)

    def prune(self, dirpath: Path, dirnames: list[str]) -> list[str]:
        """``dirnames`` of ``dirpath`` less the outputs among them (for an ``os.walk``)."""
        return [d for d in dirnames if not self.directory(Path(dirpath) / d)]

    def select(self, rels: Iterable[str]) -> list[str]:
        """``rels`` less the outputs and what lies inside them."""
        kept = [rel for rel in rels if not self.inside(rel)]
        learned = len(self.skipped)
        own = {rel for rel in kept if self.own_file(rel)}  # a store names its artifact roots
        if len(self.skipped) != learned:
            own |= {rel for rel in kept if self.inside(rel)}
        return [rel for rel in kept if rel not in own]
