"""What a package index says about a release: its files, with their sizes and hashes, from the
index's PEP 691 JSON pages (``Accept: application/vnd.pypi.simple.v1+json``; sizes per PEP 700).

Asked by ``reproduce --env venv`` (how much a rebuild downloads) and by ``publish`` (the hashes of
every file the index serves for each pinned release, beside the packed run).  Only checked https
URLs are asked, never with credentials; a page is capped; a redirect away from https is no answer.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from repro500 import untrusted
from repro500.capture.cache import cache_dir
from repro500.errors import InvalidInput
from repro500.rundir import atomic

_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # PEP 691
QUERY_TIMEOUT_S = 10
QUERY_THREADS = 16
# what an index that gives no usable answer raises (unreachable, timed out, an HTTP error, no JSON)
NO_ANSWER = (OSError, ValueError, http.client.HTTPException)
T = TypeVar("T")


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    # an index's page is asked of the checked https URL only: a redirect elsewhere is no answer
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        return super().redirect_request(req, fp, code, msg, headers, newurl) if newurl.startswith("https://") else None


class NotServed(Exception):
    """The index has no page for the project (404)."""


class Pages:
    """PEP 691 JSON pages, each thread keeping one connection per index host alive: a few hundred
    pins cost a handful of DNS lookups and TLS handshakes, not one each (urllib opens a connection
    per request).  Behind a proxy (``https_proxy``), urllib, which honours it."""

    def __init__(self) -> None:
        self._silent: set[str] = set()  # indexes that gave no answer: asked no more (one timeout, not one per pin)
        self._local = threading.local()
        self._opened: list[http.client.HTTPSConnection] = []  # every thread's, closed at the end
        self._context = ssl.create_default_context()
        self._opener = urllib.request.build_opener(_HttpsOnly) if urllib.request.getproxies().get("https") else None

    def first(self, indexes: list[str], name: str, take: Callable[[list[dict[str, Any]]], T | None]) -> T | None:
        """``take(files)`` for the first of *indexes* that serves *name* and for whose files it is not
        None; None when none does, or when an index on the way gave no answer."""
        for url in indexes:
            if url in self._silent:
                return None
            try:
                files = self.files(url, name)
            except NotServed:
                continue
            except NO_ANSWER:
                self._silent.add(url)
                return None
            value = take(files)
            if value is not None:
                return value
        return None

    def files(self, index: str, name: str) -> list[dict[str, Any]]:
        """The files of *name* on *index*; _NotServed on a 404, OSError or ValueError when the
        index gives no usable answer (unreachable, an HTTP error, an HTML-only index, no JSON)."""
        url = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
        status, content_type, body = self._urllib(url) if self._opener else self._kept_alive(url)
        if status == 404:
            raise NotServed
        if status != 200:
            raise OSError(f"HTTP {status} from {url}")
        if not content_type.startswith(_SIMPLE_JSON):
            raise ValueError("not a PEP 691 JSON page")  # an HTML-only index (a static bucket)
        try:
            page = untrusted.load_json(body, url)  # an index's answer: nesting bounded like any foreign JSON
        except InvalidInput as err:
            raise ValueError(str(err)) from None
        files = page.get("files") if isinstance(page, dict) else None
        if not isinstance(files, list):
            raise ValueError("no files list")
        return [f for f in files if isinstance(f, dict) and isinstance(f.get("filename"), str)]

    def _urllib(self, url: str) -> tuple[int, str, bytes]:
        request = urllib.request.Request(url, headers={"Accept": _SIMPLE_JSON, "User-Agent": "repro500"})
        try:
            with self._opener.open(request, timeout=QUERY_TIMEOUT_S) as answer:  # type: ignore[union-attr]
                return answer.status, str(answer.headers.get("Content-Type", "")), _capped(answer)
        except urllib.error.HTTPError as err:
            return err.code, "", b""

    def _kept_alive(self, url: str) -> tuple[int, str, bytes]:
        for _ in range(5):  # redirects followed, https only
            parts = urlsplit(url)
            if parts.scheme != "https" or not parts.hostname:
                raise ValueError("redirected away from https")
            key = (parts.hostname, parts.port or 443)
            pool = self._local.__dict__.setdefault("connections", {})
            for attempt in (0, 1):  # a kept-alive connection the server closed meanwhile: once more, anew
                connection = pool.get(key) or http.client.HTTPSConnection(
                    parts.hostname, parts.port, timeout=QUERY_TIMEOUT_S, context=self._context)
                if pool.get(key) is not connection:
                    pool[key] = connection
                    self._opened.append(connection)
                try:
                    connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                                       headers={"Accept": _SIMPLE_JSON, "User-Agent": "repro500"})
                    answer = connection.getresponse()
                    body = _capped(answer)
                    break
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    connection.close()
                    pool.pop(key, None)
                    if attempt:
                        raise
                except (OSError, http.client.HTTPException, ValueError):
                    connection.close()
                    pool.pop(key, None)
                    raise
            if answer.status in (301, 302, 303, 307, 308) and answer.getheader("Location"):
                url = urljoin(url, answer.getheader("Location"))
                continue
            return answer.status, str(answer.getheader("Content-Type") or ""), body
        raise ValueError("too many redirects")

    def close(self) -> None:
        for connection in self._opened:
            connection.close()


def _capped(answer: Any) -> bytes:
    body = answer.read(untrusted.MAX_INDEX_PAGE_BYTES + 1)
    if len(body) > untrusted.MAX_INDEX_PAGE_BYTES:
        raise ValueError("index page too large")
    return body


_SHA256 = frozenset("0123456789abcdef")


def _release_of(filename: str) -> tuple[str, Version] | None:
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None  # an egg, an installer, a name that is not a distribution's
    return name, version


# A release's files keep their hashes (an index never replaces a file under its name), but files
# can be added to a release (another platform's wheel), so what was heard is kept for a day: repeated
# publishes of one environment ask the index once, and a release's new wheels are seen next day.
CACHE_TTL_S = 24 * 3600


def _cache_file(indexes: list[str], project: str, version: Version) -> Path:
    import hashlib


    key = hashlib.sha256("\0".join([*indexes, project, str(version)]).encode()).hexdigest()[:32]
    return cache_dir("release-hashes") / f"{key}.json"


def _cached(indexes: list[str], project: str, version: Version) -> list[str] | None:
    import time

    try:
        path = _cache_file(indexes, project, version)
        if time.time() - path.stat().st_mtime > CACHE_TTL_S:
            return None
        digests = untrusted.read_json(path, "a cached digest list")
    except (OSError, ValueError, InvalidInput):
        return None  # absent, unreadable or damaged: asked again
    if isinstance(digests, list) and digests and all(isinstance(d, str) and len(d) == 64 and set(d) <= _SHA256
                                                      for d in digests):
        return digests
    return None


def _remember(indexes: list[str], project: str, version: Version, digests: list[str]) -> None:
    import contextlib


    with contextlib.suppress(OSError):  # an unwritable cache costs speed, never the publication
        atomic.write_json(_cache_file(indexes, project, version), digests)


def release_hashes(releases: list[tuple[str, str, list[str]]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """For each ``(name, version, indexes)``: the sha256 of every file the first index serving that
    release lists for it, ``{name: {"version", "sha256": [...]}}``; and the names no index answered
    for (unreachable, no JSON page, not served, no sha256 given).  Answers are kept a day in the
    cache (``CACHE_TTL_S``)."""
    from concurrent.futures import ThreadPoolExecutor

    pages = Pages()

    def one(release: tuple[str, str, list[str]]) -> list[str] | None:
        name, text, indexes = release
        try:
            version = Version(text)
        except InvalidVersion:
            return None
        project = canonicalize_name(name)

        def take(files: list[dict[str, Any]]) -> list[str] | None:
            digests = sorted({str((f.get("hashes") or {}).get("sha256") or "") for f in files
                              if _release_of(f["filename"]) == (project, version) and isinstance(f.get("hashes"), dict)})
            digests = [d for d in digests if len(d) == 64 and set(d) <= _SHA256]
            return digests or None

        cached = _cached(indexes, project, version)
        if cached is not None:
            return cached
        found = pages.first(indexes, name, take)
        if found:
            _remember(indexes, project, version, found)
        return found

    try:
        with ThreadPoolExecutor(max_workers=QUERY_THREADS) as pool:
            found = list(pool.map(one, releases))
    finally:
        pages.close()
    hashes = {name: {"version": version, "sha256": digests}
              for (name, version, _), digests in zip(releases, found, strict=True) if digests}
    return hashes, [name for (name, _, _), digests in zip(releases, found, strict=True) if not digests]

