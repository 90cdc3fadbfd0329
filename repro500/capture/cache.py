"""Where repro500 keeps caches that are safe to delete (hash cache, compiled extensions).

``$REPRO500_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/repro500``, else ``~/.cache/repro500``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache directory (or a sub-directory of it), created if absent."""
    base = os.environ.get("REPRO500_CACHE_DIR")
    if base:
        root = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "repro500"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
