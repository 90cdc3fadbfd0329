"""Where ``repro500 reproduce`` takes a publication from: a directory, a packed run, or git.

A git source (a URL, or a path to a repository) is cloned with GitPython **bare**: a bare
clone has no working tree, so git runs no checkout, hence no ``post-checkout`` hook, no
smudge/clean filter (Git LFS included) and no submodule update.  The clone also runs with
``core.hooksPath=/dev/null`` (no hook at all, whatever the user's templates install),
``protocol.ext.allow=never`` and URLs of transport helpers (``ext::``, ``fd::``) refused,
``transfer.fsckObjects`` (malformed trees, e.g. with ``..`` or ``.git`` entries, are
rejected) and ``GIT_TERMINAL_PROMPT=0`` (no credential prompt hangs).  Files are then read
from git's object database and written by this module: regular files only (symbolic links
and submodules are skipped), every path checked to stay inside the target directory, and a
Git LFS pointer reported instead of fetched.  No git command ever runs inside a tree from
the source (a repository's own config, such as ``core.fsmonitor``, is never read).

What is taken from the tree is bounded before a byte of it is read (git knows each object's
size without reading it): of a publication, only the files ``repro500 publish`` writes, each
under its cap (:func:`extract`); for ``dvc pull``, the whole commit within a count and a total
(:func:`extract_all`).  Blobs are streamed to disk, never held in memory, and trees are walked
without recursion, to at most :data:`repro500.untrusted.MAX_PATH_DEPTH` levels.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from repro500 import recorded_paths, untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.publish.publication import INDEX, OWN_FILES
from repro500.rundir import archive
from repro500.rundir import archive as archives
from repro500.rundir import sums as bundle

LFS_POINTER = b"version https://git-lfs.github.com/spec/"
MAX_TREE_FILES, MAX_TREE_ENTRIES = untrusted.MAX_TREE_FILES, untrusted.MAX_TREE_ENTRIES
_CHUNK = 1 << 20
_SCP_LIKE = re.compile(r"^[\w.+-]+@[\w.-]+:")  # user@host:path/repo.git
_GIT_CONFIG = {
    "core.hooksPath": "/dev/null",
    "protocol.ext.allow": "never",
    "transfer.fsckObjects": "true",
    "filter.lfs.smudge": "",
    "filter.lfs.process": "",
    "filter.lfs.required": "false",
    "submodule.recurse": "false",
    # index-pack holds a blob below this threshold in memory whole (a 400 MB blob: 400 MB); above
    # it, blobs are streamed.  Git's default is 512 MiB.
    "core.bigFileThreshold": "16m",
}


@dataclass
class GitCheckout:
    """A bare clone and the commit to read from it."""

    url: str
    repo: Any  # git.Repo
    commit: Any  # git.Commit
    lfs_pointers: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class Source:
    kind: str  # publication | bundle | git
    label: str
    path: Path  # the publication directory, or the archive for a bundle
    git: GitCheckout | None = None
    subpath: str = ""  # the publication's directory inside the git tree


def looks_like_url(text: str) -> bool:
    return "://" in text or bool(_SCP_LIKE.match(text)) or "::" in text.split("/", 1)[0]


def git_env() -> dict[str, str]:
    """The environment every git command of a clone runs with (see module docstring)."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_LFS_SKIP_SMUDGE="1")
    env["GIT_CONFIG_COUNT"] = str(len(_GIT_CONFIG))
    for i, (key, value) in enumerate(_GIT_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def clone(url: str, dest: Path, rev: str | None = None) -> GitCheckout:
    """Bare-clone ``url`` into ``dest`` and resolve ``rev`` (default HEAD)."""
    import git

    head = url.split("/", 1)[0]
    if url.startswith("-") or "::" in head:
        raise InvalidInput(f"{url!r} uses a git transport helper or looks like an option: give an https://, ssh://, "
                           "file:// URL or a path")
    local = Path(url)
    if not looks_like_url(url):
        url = str(local.resolve())
    try:
        # no_local: even a path goes through git's pack protocol, so transfer.fsckObjects checks every object
        repo = git.Repo.clone_from(url, dest, bare=True, no_local=not looks_like_url(url), env=git_env())
    except git.GitCommandError as err:
        detail = " ".join(str(err.stderr or "").split())[-300:] or str(err.status)
        raise InvalidInput(f"could not clone {url} ({detail})") from None
    try:
        commit = repo.commit(rev or "HEAD")
    except (git.BadName, ValueError):
        raise InvalidInput(f"{url} has no revision {rev or 'HEAD'!r}: give a branch, tag or commit with --rev") from None
    return GitCheckout(url=url, repo=repo, commit=commit)


def _size(checkout: GitCheckout, obj: Any) -> int:
    """The size git records for an object, read from its header: the object itself is not read."""
    return int(checkout.repo.odb.info(obj.binsha).size)


def _shown(parts: tuple[str, ...]) -> str:
    text = "/".join(parts[:4]) + ("/..." if len(parts) > 4 else "")
    return untrusted.plain(text[:200])


def _walk(checkout: GitCheckout, tree: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path parts, object) of every entry under ``tree``, walked with a stack, not recursion
    (GitPython's ``traverse`` recurses: a tree 1,500 deep was a RecursionError).  A path deeper than
    MAX_PATH_DEPTH, a tree object over the document cap or more than MAX_TREE_ENTRIES entries is
    InvalidInput."""
    where = f"{checkout.url} at {checkout.commit.hexsha[:12]}"
    stack: list[tuple[Any, tuple[str, ...]]] = [(tree, ())]
    seen = 0
    while stack:
        node, prefix = stack.pop()
        if _size(checkout, node) > untrusted.MAX_DOCUMENT_BYTES:
            raise InvalidInput(f"{where}: the tree {_shown(prefix) or '.'} lists more than "
                               f"{untrusted.MAX_DOCUMENT_BYTES:,} bytes of entries: refused")
        for item in node:
            seen += 1
            if seen > MAX_TREE_ENTRIES:
                raise InvalidInput(f"{where} holds more than {MAX_TREE_ENTRIES:,} entries: refused (give the "
                                   "publication's directory with --path)")
            parts = (*prefix, item.name)
            if not untrusted.path_depth_ok(parts):
                raise InvalidInput(f"{where} nests {_shown(parts)} more than {untrusted.MAX_PATH_DEPTH} "
                                   "directories deep: refused")
            if item.type == "tree":
                stack.append((item, parts))
            yield parts, item


def find_publications(checkout: GitCheckout) -> list[str]:
    """Directories (POSIX, '' for the root) of the commit's tree that hold a publication.json."""
    found = []
    for parts, item in _walk(checkout, checkout.commit.tree):
        if item.type == "blob" and parts[-1] == INDEX:
            found.append("/".join(parts[:-1]))
    return sorted(found)


def _subtree(checkout: GitCheckout, subpath: str) -> Any:
    tree = checkout.commit.tree
    if not subpath:
        return tree
    if not untrusted.path_depth_ok(PurePosixPath(subpath).parts):
        raise InvalidInput(f"--path {subpath[:200]!r} is more than {untrusted.MAX_PATH_DEPTH} directories deep")
    try:
        tree = tree / subpath
    except KeyError:
        raise InvalidInput(f"{checkout.url} has no directory {subpath!r} at {checkout.commit.hexsha[:12]}") from None
    if tree.type != "tree":
        raise InvalidInput(f"{subpath!r} in {checkout.url} is not a directory")
    return tree


def _entry(tree: Any, name: str) -> Any:
    try:
        return tree / name
    except KeyError:
        return None


def _regular_blob(item: Any) -> bool:
    return item.type == "blob" and not stat.S_ISLNK(item.mode)


def _take(checkout: GitCheckout, item: Any, target: Path, rel: str, cap: int, what: str) -> int:
    """Stream one blob to ``target`` when the size git records for it is within ``cap``; returns
    its size.  Over the cap, nothing of it is read (InvalidInput)."""
    size = _size(checkout, item)
    if size > cap:
        raise InvalidInput(f"{checkout.url}: {untrusted.plain(rel)} is {size:,} bytes, over the {cap:,}-byte cap "
                           f"for {what}: refused, nothing of it was read")
    stream = checkout.repo.odb.stream(item.binsha)
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    head = b""
    with open(target, "xb") as out:
        while written < size:
            chunk = stream.read(min(_CHUNK, size - written))
            if not chunk:
                break
            if not head:
                head = chunk[: len(LFS_POINTER)]
            out.write(chunk)
            written += len(chunk)
    if written != size:
        raise InvalidInput(f"{checkout.url}: {untrusted.plain(rel)} could not be read whole from git's object database")
    if size < 1024 and head.startswith(LFS_POINTER):
        checkout.lfs_pointers.append(rel)
    return size


def _archive_of(index: Any, where: str) -> tuple[str | None, int]:
    """(name, cap) of the packed run a publication's index names: its recorded size when the index
    records one, never above the unpack cap; (None, cap) when it names none (open_publication says so)."""
    cap = archive.max_unpack_bytes()
    meta = index.get("archive") if isinstance(index, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        return None, cap
    rel = recorded_paths.relative(name, field="archive.name", file=where)
    if not untrusted.path_depth_ok(rel.parts) or any(p.lower() == ".git" for p in rel.parts):
        raise InvalidInput(f"{where}: archive.name {untrusted.plain(name[:200])!r} is not a file a publication has")
    recorded = meta.get("bytes")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 0:
        cap = min(cap, recorded)
    return rel.as_posix(), cap


def extract(checkout: GitCheckout, subpath: str, dest: Path) -> Path:
    """Write the publication under ``subpath`` of the commit's tree into ``dest``, taking only its own files.

    Its index and digest list come first, each under the document cap.  Then the files
    ``repro500 publish`` writes (:data:`OWN_FILES`) and the archive the index names, each checked
    against its cap by the size git records (the archive: its size in the index, else the unpack
    cap; the others: the document cap) before a byte is read, and streamed to disk.  A digest list
    that names any other file is refused: a publication has nothing else to give."""
    tree = _subtree(checkout, subpath)
    where = f"{checkout.url} at {checkout.commit.hexsha[:12]}" + (f", {subpath}" if subpath else "")
    dest.mkdir(parents=True, exist_ok=True)

    def take(name: str, cap: int, what: str) -> bool:
        item = _entry(tree, name)
        if item is None:
            return False  # reported as missing by open_publication
        if not _regular_blob(item):
            checkout.skipped.append(name)  # a symbolic link, a submodule or a directory: never followed
            return False
        _take(checkout, item, dest / name, name, cap, what)
        return True

    if not take(INDEX, untrusted.MAX_DOCUMENT_BYTES, f"a publication's {INDEX}"):
        raise InvalidInput(f"{where} holds no {INDEX} as a regular file: not a publication")
    index = untrusted.load_json(untrusted.read_bytes(dest / INDEX, f"the publication's {INDEX}"), f"{where}/{INDEX}")
    archive_name, archive_cap = _archive_of(index, f"{where}/{INDEX}")
    own = {*OWN_FILES, *([archive_name] if archive_name else [])}
    if take(bundle.SUMS_NAME, untrusted.MAX_DOCUMENT_BYTES, f"a publication's {bundle.SUMS_NAME}"):
        foreign = sorted(set(bundle.read_sums(dest)) - own)
        if foreign:
            shown = ", ".join(untrusted.plain(name) for name in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            raise InvalidInput(f"{where}: the publication lists files repro500 publish never writes ({shown}): "
                               "refused, nothing of a publication but its own files is taken")
    for name in sorted(own - {INDEX, bundle.SUMS_NAME}):
        if name == archive_name:
            take(name, archive_cap, "the packed run (its size in publication.json, or the unpack cap)")
        else:
            take(name, untrusted.MAX_DOCUMENT_BYTES, f"a publication's {name}")
    return dest


def extract_all(checkout: GitCheckout, dest: Path) -> Path:
    """Write every regular file of the commit into ``dest`` (what ``dvc pull`` reads: its config,
    ``.dvc`` files, pipelines and their parameters), refused before anything is written when the
    commit holds more than MAX_TREE_FILES files or more bytes than the unpack cap or the free space."""
    where = f"{checkout.url} at {checkout.commit.hexsha[:12]}"
    files: list[tuple[str, Any]] = []
    for parts, item in _walk(checkout, checkout.commit.tree):
        if item.type == "tree":
            continue
        rel = "/".join(parts)
        if not _regular_blob(item) or any(p.lower() == ".git" for p in parts):
            checkout.skipped.append(rel)  # submodules and symbolic links
            continue
        recorded_paths.relative(rel, field="tree entry", file=checkout.url)
        files.append((rel, item))
        if len(files) > MAX_TREE_FILES:
            raise InvalidInput(f"{where} holds more than {MAX_TREE_FILES:,} files: too many to extract for dvc pull, "
                               "refused before writing any")
    cap = archive.max_unpack_bytes()
    total = 0
    for _, item in files:
        total += _size(checkout, item)
        if total > cap:
            raise InvalidInput(f"{where} holds more than {cap:,} bytes in git: more than the unpack cap "
                               "(REPRO500_MAX_UNPACK_BYTES), refused before writing any")
    dest.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest).free
    if total > free:
        raise InvalidInput(f"{where} holds {total:,} bytes in git but {dest} has {free:,} free: free some space")
    root = dest.resolve()
    for rel, item in files:
        target = dest / rel
        if not target.resolve().is_relative_to(root):
            raise InvalidInput(f"{checkout.url}: tree entry {rel} would be written outside {dest}")
        _take(checkout, item, target, rel, cap, "a file of the commit")
    return dest


def resolve(source: str, tmp: Path, *, rev: str | None = None, subpath: str | None = None) -> Source:
    """Find the publication SOURCE names; a git source is cloned and its publication extracted into ``tmp``."""
    path = Path(source)
    repo_dir = path.is_dir() and ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir()))
    # a directory holding a publication is read as it is, even inside a repository, unless a revision is asked for
    has_publication = path.is_dir() and (path / (subpath or "") / INDEX).is_file()
    is_git = looks_like_url(source) or (repo_dir and (rev is not None or not has_publication))
    if not is_git:
        if rev:
            raise UsageError("--rev applies to a git SOURCE only")
        if path.is_file() and archives.is_archive(path):
            return Source(kind="bundle", label=f"packed run {path}", path=path)
        if path.is_dir():
            base = path / subpath if subpath else path
            if (base / INDEX).is_file():
                return Source(kind="publication", label=f"publication {base}", path=base)
            raise InvalidInput(f"{base} holds no {INDEX}: give a directory written by repro500 publish, "
                               "a packed run (.tar.gz) or a git repository")
        if not path.exists():
            raise InvalidInput(f"{source} does not exist: give a publication directory, a packed run or a git URL")
        raise InvalidInput(f"{source} is neither a directory, a packed run (.tar.gz) nor a git URL")
    checkout = clone(source, tmp / "clone.git", rev)
    if subpath is None:
        found = find_publications(checkout)
        if not found:
            raise InvalidInput(f"{source} holds no {INDEX} at {checkout.commit.hexsha[:12]}: "
                               "commit a directory written by repro500 publish")
        if len(found) > 1:
            raise UsageError(f"{source} holds several publications ({', '.join(f or '.' for f in found)}): "
                             "choose one with --path")
        subpath = found[0]
    subpath = "" if subpath in ("", ".") else recorded_paths.relative(subpath.strip("/"), field="--path", file=source).as_posix()
    target = extract(checkout, subpath, tmp / "publication")
    if checkout.lfs_pointers:
        shown = ", ".join(checkout.lfs_pointers[:3])
        raise InvalidInput(f"{source}: {shown} are Git LFS pointers; repro500 does not run LFS filters from a source: "
                           "fetch them (git lfs pull) in a clone you trust and give that directory")
    label = f"{source} at {checkout.commit.hexsha[:12]}" + (f", {subpath}" if subpath else "")
    return Source(kind="git", label=label, path=target, git=checkout, subpath=subpath)


def dvc_pull(checkout: GitCheckout, paths: list[str], tmp: Path) -> Path:
    """Extract the whole commit and ``dvc pull`` ``paths`` from its DVC remote; returns the project root.

    DVC runs in the extracted copy, never in the source: with ``core.no_scm`` (the copy is
    not a git repository) and a cache in ``tmp``.  It fetches data only; no stage runs.
    """
    project = tmp / "project"
    if not project.exists():
        extract_all(checkout, project)
    if not (project / ".dvc" / "config").is_file():
        raise InvalidInput(f"{checkout.url} is not a DVC project (no .dvc/config): its data cannot be pulled")
    # PYTHONSAFEPATH: `python -m dvc` would otherwise import a dvc/ package from the source's own tree
    env = dict(os.environ, DVC_NO_ANALYTICS="1", PYTHONSAFEPATH="1")

    def dvc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, env=env, capture_output=True,
                              text=True, check=False)

    # copies, not links into a cache that is deleted with tmp
    for key, value in (("core.no_scm", "true"), ("cache.dir", str(tmp / "dvc-cache")), ("cache.type", "copy")):
        dvc("config", "--local", key, value)
    remotes = dvc("remote", "list")
    if remotes.returncode != 0 or not remotes.stdout.strip():
        raise InvalidInput(f"{checkout.url} has no DVC remote: its data ({', '.join(paths)}) cannot be pulled")
    pulled = dvc("pull", *paths)
    if pulled.returncode != 0:
        detail = " ".join((pulled.stderr or pulled.stdout).split())[-300:]
        raise InvalidInput(f"dvc pull of {', '.join(paths)} from {checkout.url} failed ({detail})")
    return project


def copy_data(source: Path, target: Path) -> None:
    """Copy a data file or directory into the reproduction (linked files are copied by content)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
