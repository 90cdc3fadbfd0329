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
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from repro500 import bundle
from repro500.errors import InvalidInput, UsageError
from repro500.publish.datafiles import safe_relpath

INDEX = "publication.json"
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
_SCP_LIKE = re.compile(r"^[\w.+-]+@[\w.-]+:")  # user@host:path/repo.git
_GIT_CONFIG = {
    "core.hooksPath": "/dev/null",
    "protocol.ext.allow": "never",
    "transfer.fsckObjects": "true",
    "filter.lfs.smudge": "",
    "filter.lfs.process": "",
    "filter.lfs.required": "false",
    "submodule.recurse": "false",
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


def find_publications(checkout: GitCheckout) -> list[str]:
    """Directories (POSIX, '' for the root) of the commit's tree that hold a publication.json."""
    found = []
    for item in checkout.commit.tree.traverse():
        if item.type == "blob" and item.name == INDEX:
            parent = PurePosixPath(item.path).parent.as_posix()
            found.append("" if parent == "." else parent)
    return sorted(found)


def extract(checkout: GitCheckout, subpath: str, dest: Path) -> Path:
    """Write the regular files under ``subpath`` of the commit's tree into ``dest``."""
    tree = checkout.commit.tree
    if subpath:
        try:
            tree = tree / subpath
        except KeyError:
            raise InvalidInput(f"{checkout.url} has no directory {subpath!r} at {checkout.commit.hexsha[:12]}") from None
        if tree.type != "tree":
            raise InvalidInput(f"{subpath!r} in {checkout.url} is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    prefix = len(PurePosixPath(subpath).parts) if subpath else 0
    for item in tree.traverse():
        parts = PurePosixPath(item.path).parts[prefix:]
        if not parts or item.type == "tree":
            continue
        rel = PurePosixPath(*parts)
        if item.type != "blob" or stat.S_ISLNK(item.mode):
            checkout.skipped.append(rel.as_posix())  # submodules and symbolic links
            continue
        if any(p.lower() == ".git" for p in rel.parts):
            checkout.skipped.append(rel.as_posix())
            continue
        safe_relpath(rel.as_posix(), f"{checkout.url}: tree entry")
        target = dest / rel
        if not target.resolve().is_relative_to(root):
            raise InvalidInput(f"{checkout.url}: tree entry {rel} would be written outside {dest}")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = item.data_stream.read()
        if data.startswith(LFS_POINTER) and len(data) < 1024:
            checkout.lfs_pointers.append(rel.as_posix())
        target.write_bytes(data)
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
        if path.is_file() and bundle.is_archive(path):
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
    subpath = "" if subpath in ("", ".") else safe_relpath(subpath.strip("/"), "--path").as_posix()
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
        extract(checkout, "", project)
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
