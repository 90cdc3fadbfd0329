"""The ``code`` facet: which code ran, exactly (git via GitPython).

Recorded: the work tree root, commit (and its time), branch (or detached), remotes with
credentials stripped, ``dirty`` (tracked files differ from the commit, git's own meaning),
the diff of those uncommitted tracked changes as the artifact ``code.diff`` (its SHA-256 in
the facet), and untracked, non-ignored files with their SHA-256.  Credential-looking
content in the diff is redacted before it is stored; ``diff_redactions`` says how many
were replaced, because a redacted diff may no longer apply cleanly.  Outside a git work
tree the facet says so (``in_repo: false``) instead of failing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from repro500.capture.outputs import OwnOutputs
from repro500.capture.registry import CaptureContext, facet
from repro500.digest import file_digest
from repro500.redact import REDACTED, redact_text, redact_url

DIFF_ARTIFACT = "code.diff"
# Untracked files above this size are listed with their size only: hashing a stray
# multi-gigabyte dataset inside the work tree would dominate the capture.
UNTRACKED_HASH_LIMIT_BYTES = 64 * 1024 * 1024
UNTRACKED_LIST_LIMIT = 1000
# git's well-known id of the empty tree: what a repository without commits is diffed against
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _open_repo(path: Path) -> Any:
    import git  # GitPython: imported here so ``repro500 --help`` does not pay for it

    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None


def redact_diff(diff: bytes) -> tuple[bytes, int]:
    """The diff with credential-looking content replaced, and how many replacements."""
    text = diff.decode("utf-8", errors="surrogateescape")
    redacted = redact_text(text)
    count = redacted.count(REDACTED) - text.count(REDACTED)
    return redacted.encode("utf-8", errors="surrogateescape"), count


def _untracked(repo: Any, root: Path) -> tuple[list[dict[str, Any]], int]:
    # repro500's own outputs (run directories, MLflow's store and its artifact roots, publications)
    # are never the experiment's state, whatever their path: capture/outputs.py tells them apart
    names = OwnOutputs(root).select(sorted(repo.untracked_files))
    out = []
    for rel in names[:UNTRACKED_LIST_LIMIT]:
        path = root / rel
        entry: dict[str, Any] = {"path": rel}
        try:
            if path.is_symlink():
                target = os.readlink(path)
                entry.update(symlink=True, sha256=hashlib.sha256(target.encode()).hexdigest())
            else:
                size = path.stat().st_size
                entry["bytes"] = size
                if size <= UNTRACKED_HASH_LIMIT_BYTES:
                    entry["sha256"] = file_digest(path)
                else:
                    entry["sha256"] = None
                    entry["skipped"] = "larger than 64 MiB; pass it with --data to digest it"
        except OSError as err:
            entry["sha256"] = None
            entry["skipped"] = err.strerror or type(err).__name__
        out.append(entry)
    return out, max(0, len(names) - UNTRACKED_LIST_LIMIT)


def describe_repo(path: str | Path | None = None) -> tuple[dict[str, Any], bytes]:
    """The code facet for the work tree containing ``path`` and the (redacted) diff bytes."""
    start = Path(path) if path is not None else Path.cwd()
    repo = _open_repo(start)
    if repo is None or repo.bare:
        return {"in_repo": False, "reason": f"{start} is not inside a git work tree"}, b""
    root = Path(repo.working_tree_dir)
    try:
        head = repo.head.commit
        commit, commit_time = head.hexsha, head.committed_datetime.isoformat()
    except ValueError:  # a repository without commits yet
        commit, commit_time = None, None
    detached = repo.head.is_detached
    branch = None if detached else repo.head.ref.name
    remotes = [
        {"name": remote.name, "url": redact_url(url)}
        for remote in repo.remotes
        for url in remote.urls
    ]
    # --no-ext-diff/--no-color/--no-textconv: the user's git config must not change the bytes
    raw = repo.git.diff(
        commit or _EMPTY_TREE, "--binary", "--no-ext-diff", "--no-color", "--no-textconv",
        stdout_as_string=False, strip_newline_in_stdout=False,  # a patch needs its last newline
    )
    diff, redactions = redact_diff(raw)
    untracked, untracked_omitted = _untracked(repo, root)
    facet_data: dict[str, Any] = {
        "in_repo": True,
        "root": str(root),
        "commit": commit,
        "commit_time": commit_time,
        "branch": branch,
        "detached": detached,
        "remotes": remotes,
        "dirty": bool(diff),
        "diff": (
            {"artifact": DIFF_ARTIFACT, "sha256": hashlib.sha256(diff).hexdigest(),
             "bytes": len(diff), "redactions": redactions}
            if diff else None
        ),
        "untracked": untracked,
        "untracked_omitted": untracked_omitted,
    }
    return facet_data, diff


@facet("code")
def code_facet(ctx: CaptureContext) -> dict[str, Any]:
    data, diff = describe_repo(ctx.repo_dir)
    if diff:
        ctx.artifacts[DIFF_ARTIFACT] = diff
    return data
