"""Which index serves what in a rebuild.

The packages come from the reproducer's own indexes (what ``PIP_INDEX_URL``/``UV_DEFAULT_INDEX``
and their extra-index variables name, else the installer's default); an index the lock names is
asked only when the reproducer names it too (``--index URL``): a publisher's index would otherwise
serve every pin, and the build tools the installer fetches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from repro500.capture.lock import PYPI
from repro500.publish.rebuild.installer import installer
from repro500.publish.rebuild.lock import Pins
from repro500.redact import redact_url

_TRUE = ("1", "true", "yes", "on")


def _bare(url: str) -> str:
    """*url* as an index's identity: no credentials, no trailing slash, the host in lower case."""
    parts = urlsplit(url.strip())
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}{port}{parts.path.rstrip('/')}"


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
