"""How much the installer will download: each ``name==version`` asked of its index's PEP 691 JSON
page (PEP 700 sizes), the file picked as the installer would pick it here.  An index that is
unreachable or answers no JSON makes the size unknown, never fails the rebuild; a pin no wheel
fits here is named, as the installer builds it from source, running its build backend."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from repro500.progress import human_bytes
from repro500.publish import index
from repro500.publish.rebuild.lock import Pins
from repro500.publish.rebuild.serving import Serving, serving


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

    def brief(self) -> str:
        """What the install step's line says of the download: ``up to 1.9 GB to download``."""
        parts = [f"up to {human_bytes(self.bytes_from_indexes)} to download" if self.sized else ""]
        parts += [f"{self.local} from --find-links" if self.local else "",
                  f"download size unknown for {self.unknown}" if self.unknown else ""]
        return ", ".join(p for p in parts if p) or "nothing to download"


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
    """How much the installer will fetch for the pins (see the module docstring), each asked of the
    indexes *served* says (default: the reproducer's own, no --index)."""
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
