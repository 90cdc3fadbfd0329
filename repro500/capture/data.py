"""The ``data`` facet: DVC-compatible digests of input files and directories.

Formulas (DVC 3, ``hash: md5``; docs/capture.md recomputes them with the standard library):

* a **file**'s digest is the plain MD5 of its bytes;
* a **directory**'s digest is ``md5(json.dumps(entries, sort_keys=True)) + ".dir"`` where
  ``entries`` is ``[{"md5": <file md5>, "relpath": "<a/b.txt>"}, ...]`` for every file under
  it, sorted by ``relpath`` (``/``-separated), with ``json.dumps``' default separators.
  As in DVC, ``.git``, ``.hg`` and ``.dvc`` directories are skipped and symbolic links to
  directories are not followed (links to files are hashed by content).

So the ``md5`` recorded for a DVC-tracked dataset equals its ``.dvc`` / ``dvc.lock`` entry.
Files are hashed in parallel threads (``hashlib`` releases the GIL while hashing), and a
cache keyed by (path, inode, size, mtime_ns) under :func:`repro500.capture.cache.cache_dir` means
unchanged data is not read again.  ``python -m repro500.capture.data PATH...`` prints the
entries as JSON.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro500 import progress as shown
from repro500 import recorded_paths
from repro500.capture import md5mb
from repro500.capture.cache import cache_dir
from repro500.capture.hardware import usable_cpus
from repro500.capture.registry import CaptureContext, facet
from repro500.errors import InvalidInput

if TYPE_CHECKING:
    import sqlite3

HASH_NAME = "md5"
IGNORED_DIRS = frozenset({".git", ".hg", ".dvc"})  # DVC's default ignore list
_CHUNK_BYTES = 1 << 20
# Below this many files the multi-buffer kernel would mostly idle; hashlib threads are as fast.
MULTIBUFFER_MIN_FILES = 8  # below this a progress bar only flickers
# A file modified this recently may be modified again within the same mtime tick without
# its (size, mtime_ns) changing ("racy git"); its digest is used but not cached.
RACY_WINDOW_NS = 1_000_000_000


@dataclass(frozen=True)
class _File:
    abspath: str
    relpath: str  # "/"-separated, relative to the digested directory ("" for a file)
    inode: int
    size: int
    mtime_ns: int


def md5_file(path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None,
             stop: threading.Event | None = None, limit: int | None = None) -> str:
    """Plain MD5 of a file's bytes (DVC 3's file hash), read in 1 MiB chunks.  With ``limit`` (the
    size the file was listed with), reading stops as soon as it yields more: a file that streams
    past its stated size (a kernel file, one being written) is never read without end."""
    digest = hashlib.md5()
    buf = bytearray(_CHUNK_BYTES)
    view = memoryview(buf)
    pending = total = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            total += n
            if limit is not None and total > limit:
                raise md5mb.ChangedWhileHashing(errno.EFBIG, "grew past its listed size", os.fspath(path))
            digest.update(view[:n])
            pending += n
            if stop is not None and stop.is_set():
                raise _Cancelled(str(path))
            if on_bytes is not None and pending >= 64 * _CHUNK_BYTES:
                on_bytes(pending)
                pending = 0
    if on_bytes is not None and pending:
        on_bytes(pending)
    return digest.hexdigest()


def dir_md5(file_md5s: Iterable[tuple[str, str]]) -> str:
    """DVC's directory digest from ``(relpath, md5)`` pairs (see module docstring)."""
    entries = sorted(({"md5": md5, "relpath": rel} for rel, md5 in file_md5s),
                     key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"


def _stat_file(abspath: str, relpath: str) -> _File:
    try:
        st = os.stat(abspath)
    except FileNotFoundError:
        raise InvalidInput(
            f"data file '{abspath}' is a broken symbolic link or vanished: fix it or leave it out"
        ) from None
    except OSError as err:
        raise InvalidInput(f"cannot read data file '{abspath}' ({err.strerror}): "
                           "fix its permissions or leave it out") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block its read forever, /dev/zero never end
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
        raise InvalidInput(f"data file '{abspath}' is {kind}, not a regular file: leave it out of the data")
    return _File(abspath, relpath, st.st_ino, st.st_size, st.st_mtime_ns)


def _list_files(path: str) -> tuple[bool, list[_File]]:
    """(is_directory, files) for a data path, raising InvalidInput when it is unusable."""
    if not os.path.lexists(path):
        raise InvalidInput(f"data path '{path}' does not exist: check the path")
    abspath = os.path.abspath(path)
    if not os.path.isdir(abspath):
        if not os.path.isfile(abspath) and os.path.exists(abspath):
            raise InvalidInput(f"data path '{path}' is not a regular file or directory")
        return False, [_stat_file(abspath, "")]
    files: list[_File] = []

    def walk_error(err: OSError) -> None:
        raise InvalidInput(f"cannot read data directory '{err.filename}' ({err.strerror}): "
                           "fix its permissions or leave it out")

    for dirpath, dirnames, filenames in os.walk(abspath, onerror=walk_error):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_DIRS]
        rel_dir = os.path.relpath(dirpath, abspath)
        for name in filenames:
            if name == ".git":  # a submodule's gitfile; DVC ignores it too
                continue
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            files.append(_stat_file(full, rel))
    return True, files


class HashCache:
    """md5 digests keyed by (path, inode, size, mtime_ns), in one SQLite file.

    Safe to delete at any time.  A damaged cache file is moved aside and replaced rather
    than failing a capture: the cache only saves time, it never decides a digest.
    """

    def __init__(self, path: Path | None = None) -> None:
        import sqlite3  # imported when a cache is opened: --no-cache never pays for it

        self.path = path or cache_dir("hashes") / "md5.sqlite"
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError:
            with contextlib.suppress(OSError):
                os.replace(self.path, f"{self.path}.damaged")
            self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        import sqlite3

        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS md5 (path TEXT PRIMARY KEY, inode INTEGER, "
            "size INTEGER, mtime_ns INTEGER, md5 TEXT)"
        )
        conn.commit()
        return conn

    def lookup(self, files: Sequence[_File]) -> dict[str, str]:
        """{abspath: md5} for the files whose key is unchanged since they were cached."""
        found: dict[str, str] = {}
        cur = self._conn.cursor()
        for f in files:
            row = cur.execute(
                "SELECT inode, size, mtime_ns, md5 FROM md5 WHERE path = ?", (f.abspath,)
            ).fetchone()
            if row and tuple(row[:3]) == (f.inode, f.size, f.mtime_ns):
                found[f.abspath] = row[3]
        return found

    def store(self, rows: Sequence[tuple[_File, str]]) -> None:
        if not rows:
            return
        with self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO md5 (path, inode, size, mtime_ns, md5) VALUES (?,?,?,?,?)",
                [(f.abspath, f.inode, f.size, f.mtime_ns, md5) for f, md5 in rows],
            )

    def close(self) -> None:
        self._conn.close()


def _open_cache() -> HashCache | None:
    import sqlite3

    try:
        return HashCache()
    except (sqlite3.Error, OSError):
        return None  # an unwritable cache directory costs speed, not correctness


class OverTime(Exception):
    """Hashing passed the deadline it was given (digest_paths' ``deadline``)."""


def _hash_all(files: list[_File], jobs: int, progress: bool, deadline: float | None = None) -> dict[str, str]:
    """{abspath: md5} for ``files``, largest first so threads finish together; OverTime once
    ``time.monotonic()`` passes ``deadline`` (checked every 64 MiB and at each file's end)."""
    if not files:
        return {}
    if deadline is not None and time.monotonic() > deadline:
        raise OverTime()
    total_bytes = sum(f.size for f in files)
    order = sorted(files, key=lambda f: f.size, reverse=True)

    step: Any = shown.step("hashing data", total_bytes, files=len(order)) if progress else contextlib.nullcontext(None)
    with step as meter:
        on_bytes = None
        if meter is not None:
            lock = threading.Lock()

            def on_bytes(n: int) -> None:
                with lock:  # hashing threads report at once
                    meter.advance(n)

        if deadline is not None:
            shown_bytes = on_bytes

            def on_bytes(n: int) -> None:
                if time.monotonic() > deadline:
                    raise OverTime()
                if shown_bytes is not None:
                    shown_bytes(n)

        try:
            if len(order) >= MULTIBUFFER_MIN_FILES and md5mb.available():
                return _hash_multibuffer([f.abspath for f in order], jobs, on_bytes)
            return _hash_threads([f.abspath for f in order], jobs, on_bytes, {f.abspath: f.size for f in order})
        except md5mb.ChangedWhileHashing as err:
            raise InvalidInput(f"data file '{err.filename}' changed while it was being hashed: hash it "
                               "once nothing writes to it") from None
        except OSError as err:
            raise InvalidInput(f"cannot read data file '{err.filename}' ({err.strerror}): "
                               "fix its permissions or leave it out") from None


class _Cancelled(Exception):
    """A worker noticed that the caller was interrupted (Ctrl-C) and stopped early."""


def _parallel(func: Callable[..., Any], items: list[Any], workers: int) -> list[Any]:
    """``[func(item, stop) for item in items]`` on threads; Ctrl-C stops them within a chunk.

    Without the stop event, leaving a ``ThreadPoolExecutor`` block after Ctrl-C would wait
    for every queued file of a multi-terabyte dataset to be hashed.
    """
    from concurrent.futures import (  # not paid by one-file digests
        FIRST_EXCEPTION,
        ThreadPoolExecutor,
        wait,
    )

    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(func, item, stop) for item in items]
        # FIRST_EXCEPTION: one unreadable file stops the others instead of waiting for them
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                raise f.exception()
        return [f.result() for f in futures]
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _hash_threads(paths: list[str], jobs: int, on_bytes: Callable[[int], None] | None,
                  sizes: dict[str, int] | None = None) -> dict[str, str]:
    """hashlib, one file per thread (few or huge files), each read no further than its listed size."""
    sizes = sizes or {}
    if jobs <= 1 or len(paths) == 1:
        return {p: md5_file(p, on_bytes, None, sizes.get(p)) for p in paths}
    digests = _parallel(lambda p, stop: md5_file(p, on_bytes, stop, sizes.get(p)), paths, min(jobs, len(paths)))
    return dict(zip(paths, digests, strict=True))


def _hash_multibuffer(paths: list[str], jobs: int,
                      on_bytes: Callable[[int], None] | None) -> dict[str, str]:
    """The multi-buffer kernel, one engine per thread, files dealt largest-first round-robin."""
    engines = max(1, min(jobs, len(paths) // MULTIBUFFER_MIN_FILES))
    shares = [paths[i::engines] for i in range(engines)]
    if engines == 1:
        return md5mb.md5_files(shares[0], on_bytes)
    out: dict[str, str] = {}
    for part in _parallel(lambda share, stop: md5mb.md5_files(share, on_bytes, stop), shares,
                          engines):
        out.update(part)
    return out


def digest_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: bool = False,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Digest every path (file or directory), in the order given.

    With ``deadline`` (a ``time.monotonic()`` value), hashing what the cache does not know stops
    with :class:`OverTime` once it passes (a digest known to the cache costs a lookup).

    Each entry is ``{"path", "kind", "hash": "md5", "md5", "size", "nfiles"}`` with ``size``
    in bytes (the sum over a directory's files) and ``nfiles`` the number of files of a
    directory (``None`` for a single file, as in DVC's ``.dvc`` files).  Raises
    :class:`InvalidInput` for a missing or unreadable path.
    """
    listed = []
    for p in paths:
        path = os.fspath(p)
        is_dir, files = _list_files(path)
        listed.append((path, is_dir, files))
    unique = list({f.abspath: f for _, _, files in listed for f in files}.values())
    cache = _open_cache() if use_cache else None
    try:
        known = cache.lookup(unique) if cache else {}
        todo = [f for f in unique if f.abspath not in known]
        started_ns = time.time_ns()
        fresh = _hash_all(todo, jobs or usable_cpus(), progress, deadline)
        if cache:
            cache.store([(f, fresh[f.abspath]) for f in todo
                         if f.mtime_ns < started_ns - RACY_WINDOW_NS])
    finally:
        if cache:
            cache.close()
    md5_of = {**known, **fresh}
    entries = []
    for path, is_dir, files in listed:
        size = sum(f.size for f in files)
        if is_dir:
            md5 = dir_md5((f.relpath, md5_of[f.abspath]) for f in files)
        else:
            md5 = md5_of[files[0].abspath]
        entries.append({"path": path, "kind": "directory" if is_dir else "file", "hash": HASH_NAME,
                        "md5": md5, "size": size, "nfiles": len(files) if is_dir else None})
    return entries


def size_of(path: str | os.PathLike[str]) -> int:
    """The bytes of a file, or of a directory's files, from the listing alone (nothing is read)."""
    return sum(f.size for f in _list_files(os.fspath(path))[1])


def digest_path(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The digest entry of one file or directory (see :func:`digest_paths`)."""
    return digest_paths([path])[0]


def compare(entries: Iterable[dict[str, Any]]) -> list[str]:
    """Re-digest recorded entries; one sentence per path that is missing or changed.

    Relative paths are resolved against the current directory.  An empty list means every
    recorded dataset is byte-for-byte what was recorded.
    """
    problems = []
    for entry in entries:
        try:  # someone else's record may name /proc/self/pagemap, ".", a FIFO: refused, never read
            path = str(recorded_paths.resolve(entry.get("path"), field="data path", file="the manifest",
                                              anywhere=True))
        except InvalidInput as err:
            problems.append(str(err))
            continue
        if not os.path.exists(path):
            problems.append(f"data path '{path}' recorded in the manifest is missing here")
            continue
        try:
            # Sizes first, from the listing: a path whose bytes or file count already differ from the
            # record is changed without hashing it (a recorded input may name a large directory of
            # the reader's that has nothing to do with the experiment).
            is_dir, files = _list_files(path)
            now = {"md5": None, "size": sum(f.size for f in files), "nfiles": len(files) if is_dir else None}
            if now["size"] == entry.get("size") and now["nfiles"] == entry.get("nfiles"):
                now = digest_path(path)
        except InvalidInput as err:
            problems.append(str(err))
            continue
        if now["md5"] is None:
            problems.append(f"data path '{path}' changed: {now['size']} bytes"
                            + (f", {now['nfiles']} files" if now["nfiles"] is not None else "")
                            + f" here, the manifest recorded {entry.get('size')} bytes"
                            + (f", {entry.get('nfiles')} files" if entry.get("nfiles") is not None else "")
                            + " (not hashed)")
        elif now["md5"] != entry.get("md5"):
            problems.append(
                f"data path '{path}' changed: md5 is {now['md5']} ({now['size']} bytes"
                + (f", {now['nfiles']} files" if now["nfiles"] is not None else "")
                + f"), the manifest recorded {entry.get('md5')} ({entry.get('size')} bytes"
                + (f", {entry.get('nfiles')} files" if entry.get("nfiles") is not None else "")
                + ")"
            )
    return problems


@facet("data")
def data_facet(ctx: CaptureContext) -> dict[str, Any]:
    facet = {"entries": digest_paths(ctx.data_paths, use_cache=ctx.use_cache, progress=ctx.progress, jobs=ctx.jobs)}
    if ctx.input_paths:  # a wrapped command's declared inputs: read where they are, not placed
        facet["inputs"] = digest_paths(ctx.input_paths, use_cache=ctx.use_cache, progress=ctx.progress, jobs=ctx.jobs)
    return facet


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m repro500.capture.data PATH...``: print the digest entries as JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m repro500.capture.data",
                                     description="DVC-compatible md5 digests of files and directories.")
    parser.add_argument("paths", nargs="+", help="files or directories to digest")
    parser.add_argument("--no-cache", action="store_true", help="re-read every file")
    parser.add_argument("--jobs", type=int, default=None, help="hashing threads (default: usable CPUs)")
    args = parser.parse_args(argv)
    try:
        entries = digest_paths(args.paths, jobs=args.jobs, use_cache=not args.no_cache,
                               progress=True)
    except InvalidInput as err:
        print(f"repro500: error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps(entries, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
