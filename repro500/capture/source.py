"""The experiment's own source, copied into the run directory as it ran (``source/``).

A publication must rerun on a machine that has only the publication: the files of a wrapped
command's working directory (or a plug-in's imported modules) travel inside the run, sealed by
``SHA256SUMS`` like every other file, with ``source.json`` listing each file's digest and one
digest over the whole tree (``tree_sha256``): two runs whose trees have the same digest ran the
same experiment code, whatever git said about either (a reproduction from a publication is not
a git work tree).

Which files: inside a git work tree, the tracked and the untracked-but-not-ignored files under
the directory, as they are in the work tree (uncommitted edits are what ran); outside one, every
file under it.  Never hidden files (a ``.env`` holds secrets), caches, virtual environments or
repro500's own outputs: ``runs/``, ``publications/``, ``reproductions/``, MLflow's ``mlruns/`` and
``mlartifacts/`` by name, whatever the runner names (the ``--out`` directory, the tracking store's
files and artifact roots), and every run directory, publication, reproduction, packed run, MLflow
store and artifact root recognised by what it holds, whatever it is called
(:mod:`repro500.capture.outputs`).  Anything past the size limits is
listed with its digest but not copied, and ``complete`` says so.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from repro500.capture import dvcowned
from repro500.capture.code import GitError, git, work_tree
from repro500.capture.outputs import OwnOutputs
from repro500.digest import file_digest, tree_digest
from repro500.rundir import atomic
from repro500.rundir.names import SOURCE_DIR, SOURCE_INDEX

SCHEMA = "repro500/source/v1"
DIR = SOURCE_DIR
INDEX = SOURCE_INDEX
FILE_LIMIT_BYTES = 16 * 1024 * 1024  # one larger file is data, not source: listed, not copied
TOTAL_LIMIT_BYTES = 128 * 1024 * 1024
COUNT_LIMIT = 5000
# Files that say how to install an experiment's requirements (kept with its source)
REQUIREMENTS = "requirements.txt"
PYPROJECT = "pyproject.toml"
# Never experiment source, whatever the directory holds; ``runs`` is repro500's own output.
_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache",
              ".ruff_cache", "runs", "mlruns", "mlartifacts", ".dvc", "node_modules", "reproductions",
              "publications"}


def _git_files(root: Path) -> list[str] | None:
    """Tracked and untracked non-ignored files under ``root`` (relative), or None outside git."""
    try:
        top = work_tree(root)
        if top is None:
            return None
        out = git(top, "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", ".")
    except GitError:
        return None
    # ls-files runs in the repository root: paths are relative to it, filtered to root below
    top = top.resolve()
    names = []
    for rel in filter(None, (out or b"").decode("utf-8", errors="surrogateescape").split("\0")):
        path = (top / rel).resolve()
        if path.is_relative_to(root.resolve()):
            names.append(path.relative_to(root.resolve()).as_posix())
    return names


def _walk_files(root: Path, own: OwnOutputs) -> list[str]:
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = own.prune(Path(dirpath), sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")))
        for name in sorted(filenames):
            if not name.startswith("."):
                names.append((Path(dirpath) / name).relative_to(root).as_posix())
    return names


def _top(root: Path) -> Path:
    """The git work tree's root above *root*, where pipelines covering it may sit (else *root*)."""
    try:
        return work_tree(root) or root
    except GitError:
        return root


def candidates(root: Path, exclude: list[Path] = ()) -> list[str]:
    """The files of the experiment under ``root``, sorted, outside ``exclude`` (the run's output)
    and outside every other output of repro500's, recognised by what it holds
    (:mod:`repro500.capture.outputs`)."""
    root = root.resolve()
    # what DVC writes (params.yaml, dvc.lock, stage outputs and metrics) is not the experiment's code
    skip = [p.resolve() for p in exclude] + dvcowned.owned(root, _top(root))
    own = OwnOutputs(root, [p for p in skip if p.is_dir()])
    names = _git_files(root)
    if names is None:
        names = _walk_files(root, own)
    out = []
    for rel in own.select(sorted(set(names))):
        # Hidden files are left out whether or not git tracks them: a ``.env`` holds secrets,
        # and the same experiment must give the same file set inside and outside a work tree.
        if any(part in _SKIP_DIRS or part.startswith(".") for part in Path(rel).parts):
            continue
        path = root / rel
        if path.is_symlink() or not path.is_file() or any(path.resolve().is_relative_to(s) for s in skip):
            continue
        out.append(rel)
    return out


def snapshot(root: Path, files: list[str], run_dir: Path) -> dict[str, Any]:
    """Copy ``files`` (relative to ``root``) into ``run_dir/source`` and write ``source.json``."""
    entries, total, copied = [], 0, 0
    complete = True
    for rel in files[:COUNT_LIMIT]:
        path = root / rel
        try:
            size = path.stat().st_size
            digest = file_digest(path)
        except OSError as err:
            entries.append({"path": rel, "sha256": None, "copied": False, "skipped": err.strerror or type(err).__name__})
            complete = False
            continue
        entry: dict[str, Any] = {"path": rel, "bytes": size, "sha256": digest, "copied": False}
        if os.access(path, os.X_OK):
            entry["executable"] = True  # an archive keeps no modes: a reproduction restores it from here
        if size > FILE_LIMIT_BYTES or total + size > TOTAL_LIMIT_BYTES:
            entry["skipped"] = "larger than the source limits (docs/command.md): listed, not copied"
            complete = False
        else:
            target = run_dir / DIR / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            entry["copied"] = True
            total += size
            copied += 1
        entries.append(entry)
    if len(files) > COUNT_LIMIT:
        complete = False
    tree = tree_digest((e["sha256"], e["path"]) for e in entries)
    index = {"schema": SCHEMA, "root": str(root.resolve()), "files": entries, "copied": copied,
             "bytes": total, "omitted": max(0, len(files) - COUNT_LIMIT), "complete": complete,
             "tree_sha256": tree}
    atomic.write_json(run_dir / INDEX, index)
    return {"tree_sha256": tree, "files": len(entries), "copied": copied, "bytes": total, "complete": complete}


def recheck(root: Path, run_dir: Path) -> tuple[str, list[str]] | None:
    """For a resumed run: :func:`tree_digest` over the files the first attempt kept (its
    ``source.json``), as they are now under ``root``, and the paths whose content differs.

    The resume compares with the run's own list, not with the directory as it is now: repeats
    that already ran may have written new files into the experiment's tree (a command's outputs,
    checkpoints), which are no edit of the source.  A changed, deleted or newly unreadable file
    of that list is.  None when the run kept no source (a built-in recipe)."""
    try:
        index = json.loads((Path(run_dir) / INDEX).read_text(encoding="utf-8"))
        entries = [(str(e["path"]), e.get("sha256")) for e in index["files"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None  # no copy to compare with: the manifest comparison reports the source as absent
    pairs, changed = [], []
    for rel, recorded in entries:
        try:
            now = file_digest(root / rel)
        except OSError:
            now = None
        pairs.append((now, rel))
        if now != recorded:
            changed.append(rel)
    return tree_digest(pairs), changed


def package_digest(root: Path) -> str:
    """:func:`tree_digest` over a Python package's own source files (repro500's, in the manifest):
    two runs with the same one ran the same repro500, from a git checkout or not."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in (".py", ".cpp", ".h", ".cu", ".cuh", ".yaml", ".json")
             and "__pycache__" not in p.parts]
    return tree_digest((file_digest(p), p.relative_to(root).as_posix()) for p in files)


def requirements(files: list[str]) -> list[str]:
    """The files among ``files`` that say how to install the experiment's requirements."""
    wanted = {REQUIREMENTS, PYPROJECT, "setup.py", "environment.yml", "environment.yaml", "setup.cfg"}
    return [f for f in files if f in wanted or (Path(f).name.startswith("requirements") and f.endswith(".txt"))]


def python_path(value: str | None, root: Path) -> dict[str, list[str]]:
    """A command's ``PYTHONPATH`` against the experiment's directory: entries inside it relative
    to it (``src``), which a reproduction re-roots into its copy of the source, and the others
    as they were (they name places on the original machine, and are not carried)."""
    inside, outside = [], []
    root = root.resolve()
    for entry in (value or "").split(os.pathsep):
        if not entry:
            continue
        path = (root / entry).resolve()  # a relative entry is relative to the command's directory
        if path.is_relative_to(root):
            inside.append(path.relative_to(root).as_posix() or ".")
        else:
            outside.append(entry)
    return {"inside": inside, "outside": outside}


def copied_files(run_dir: Path) -> frozenset[str]:
    """The absolute paths, where the experiment ran, of the files its run copied into ``source/``
    (a command's reads of these are its code, not its inputs)."""
    index = Path(run_dir) / INDEX
    try:
        doc = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return frozenset()
    root = Path(str(doc.get("root") or "."))
    return frozenset(str(root / e["path"]) for e in doc.get("files") or [] if e.get("copied") and e.get("path"))
