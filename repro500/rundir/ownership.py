"""Whether a run directory is one's own: made by this machine's repro500 as it now is.

The runner records every run it makes (once its manifest is written, and at every seal) in the
user's state directory, keyed by the run's identity; a run unpacked from an archive, extracted
from a publication, downloaded from MLflow or copied from elsewhere has no such record and stays
somebody else's (docs/trust.md, "How a run is known to be one's own").  What follows from that
(the consent to run its code) is :func:`repro500.untrusted.consent`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from repro500.errors import InvalidInput
from repro500.rundir.names import MANIFEST, RECIPE, SOURCE_DIR, SOURCE_INDEX, SUMS_NAME
from repro500.untrusted import FOREIGN_RUN, OWN_RUN, load_json, read_bytes

STATE_ENV = "REPRO500_STATE_DIR"  # where repro500 keeps what it knows of this machine (its own runs)
_OWN_RUNS = "own-runs"


def state_dir(*parts: str) -> Path:
    """``$REPRO500_STATE_DIR``, else ``$XDG_STATE_HOME/repro500``, else ``~/.local/state/repro500``
    (not the cache: deleting it only makes one's own runs ask for consent again)."""
    base = os.environ.get(STATE_ENV)
    if base:
        return Path(base).joinpath(*parts)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state").joinpath("repro500", *parts)


def _identity(root: Path) -> tuple[str, dict[str, str]] | None:
    """(a key for the run directory as this machine's repro500 would have recorded it, the SHA-256
    of each file of its code that key vouches for), or None when it cannot be read.  A sealed run:
    its digest list's SHA-256, and what that list says of ``recipe.yaml`` and ``source/``.  A run
    not sealed yet (killed before its seal): its manifest, recipe and ``source.json`` together, and
    what ``source.json`` says of each file copied into ``source/``."""
    import hashlib

    try:
        data = read_bytes(root / SUMS_NAME, "the digest list", follow=False)
    except FileNotFoundError:
        data = None
    except (OSError, InvalidInput):
        return None
    if data is not None:
        lines = {}
        for line in data.decode("utf-8", "replace").splitlines():
            digest, sep, rel = line.partition("  ")
            if sep and not line.startswith("#") and (rel == RECIPE or rel.startswith(SOURCE_DIR + "/")):
                lines[rel] = digest
        return "sealed-" + hashlib.sha256(data).hexdigest(), lines
    try:
        parts = [read_bytes(root / name, name, follow=False) for name in (MANIFEST, RECIPE)]
        index = read_bytes(root / SOURCE_INDEX, SOURCE_INDEX, follow=False) \
            if os.path.lexists(root / SOURCE_INDEX) else b""
    except (OSError, InvalidInput):
        return None
    key = hashlib.sha256(b"\0".join([*parts, index])).hexdigest()
    files = (load_json(index, SOURCE_INDEX) if index else {}) or {}
    lines = {RECIPE: hashlib.sha256(parts[1]).hexdigest()}
    for entry in files.get("files") or [] if isinstance(files, dict) else []:
        if isinstance(entry, dict) and entry.get("copied") and isinstance(entry.get("path"), str):
            lines[f"{SOURCE_DIR}/{entry['path']}"] = str(entry.get("sha256"))
    return "started-" + key, lines


def record_own_run(run_dir: str | Path) -> None:
    """Remember that this machine's repro500 made ``run_dir`` as it now is (the runner calls it
    once the manifest is written and after every seal): a record in the user's state directory,
    keyed by the run's identity (:func:`_identity`), which no archive, publication or download can
    write.  Best effort: without it the run is only asked consent for, as somebody else's."""
    identity = _identity(Path(run_dir))
    if identity is None:
        return
    try:
        folder = state_dir(_OWN_RUNS)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / identity[0]).write_text(str(Path(run_dir).resolve()) + "\n", encoding="utf-8")
    except OSError:
        pass


def origin_of(run_dir: str | Path) -> str:
    """:data:`OWN_RUN` when this machine's repro500 made the run directory as it is (its identity
    recorded by :func:`record_own_run`, and its code, ``recipe.yaml`` and every file under
    ``source/``, exactly the files that identity vouches for), else :data:`FOREIGN_RUN`.  A run
    unpacked from an archive, extracted from a publication, downloaded from MLflow or copied from
    elsewhere stays foreign, whatever its files say; one's own run packed and unpacked is one's own."""
    import hashlib

    root = Path(run_dir)
    identity = _identity(root)
    if identity is None or not state_dir(_OWN_RUNS, identity[0]).is_file():
        return FOREIGN_RUN
    lines = identity[1]
    present = [RECIPE] if os.path.lexists(root / RECIPE) else []
    for dirpath, dirnames, filenames in os.walk(root / SOURCE_DIR):
        links = [name for name in dirnames if os.path.islink(os.path.join(dirpath, name))]  # never vouched for
        present += [Path(dirpath, name).relative_to(root).as_posix() for name in (*filenames, *links)]
    if sorted(present) != sorted(lines):
        return FOREIGN_RUN  # code added or taken away since this machine recorded the run
    for rel in present:
        try:
            if hashlib.sha256(read_bytes(root / rel, rel, follow=False)).hexdigest() != lines[rel]:
                return FOREIGN_RUN
        except (OSError, InvalidInput):
            return FOREIGN_RUN
    return OWN_RUN
