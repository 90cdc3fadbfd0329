"""Canonical JSON and content digests.

Canonicalisation (``repro500-c14n/v1``, documented in docs/contracts.md): the JSON value
is serialised with ``json.dumps(value, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` and encoded as UTF-8; the digest is the SHA-256 of
those bytes in lower-case hex.  Anyone can recompute it with the standard library alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CANONICALIZATION = "repro500-c14n/v1"
_CHUNK = 1 << 20


def canonical_json(value: Any) -> bytes:
    """The canonical byte form of a JSON-able value (see module docstring)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_digest(value: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(pairs: Iterable[tuple[str | None, str]]) -> str:
    """One SHA-256 over (file digest, relative path) pairs in ``sha256sum`` line form: the same
    files with the same contents give the same digest wherever they lie.  The one formula for a
    digest over many files (a source snapshot, repro500's own package, a command's outputs)."""
    return hashlib.sha256("".join(f"{digest}  {path}\n" for digest, path in pairs).encode()).hexdigest()
