"""The ``code`` facet: which code ran, exactly (git's own command line).

Recorded: the work tree root, commit (and its time), branch (or detached), remotes with
credentials stripped, ``dirty`` (tracked files differ from the commit, git's own meaning),
the diff of those uncommitted tracked changes as the artifact ``code.diff`` (its SHA-256 in
the facet), and untracked, non-ignored files with their SHA-256.  Credential-looking
content in the diff is redacted before it is stored; ``diff_redactions`` says how many
were replaced, because a redacted diff may no longer apply cleanly.  Outside a git work
tree the facet says so (``in_repo: false``) instead of failing.

The facet asks git itself, one command per question, rather than through GitPython: importing
GitPython costs about 30 ms, a sixth of a whole ``repro500 capture``, and GitPython answers
these same questions by running the same git commands.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
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


class GitError(RuntimeError):
    """git ran and refused (a repository it will not read, a broken one): its own words."""


def git(cwd: Path, *args: str, check: bool = True) -> bytes | None:
    """``git args`` run in ``cwd``: its standard output, or None when it exits non-zero and
    ``check`` is false.  The user's configuration cannot change what is read: no pager, no
    colour, no external diff or text conversion (set by the callers that diff)."""
    proc = subprocess.run(["git", "--no-pager", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, check=False,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    if proc.returncode == 0:
        return proc.stdout
    if check:
        raise GitError(f"git {args[0]}: {proc.stderr.decode(errors='replace').strip() or f'exit {proc.returncode}'}")
    return None


def work_tree(path: Path) -> Path | None:
    """The root of the git work tree containing ``path``; None outside one (or in a bare repository)."""
    proc = subprocess.run(["git", "rev-parse", "--is-bare-repository", "--show-toplevel"], cwd=path,
                          stdin=subprocess.DEVNULL, capture_output=True, check=False,
                          env={**os.environ, "LC_ALL": "C"})
    if proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip()
        if "not a git repository" in message or "must be run in a work tree" in message:
            return None
        raise GitError(f"git could not read the repository at {path}: {message}")
    lines = proc.stdout.decode(errors="surrogateescape").splitlines()
    if not lines or lines[0] == "true" or len(lines) < 2:
        return None
    return Path(lines[1])


def redact_diff(diff: bytes) -> tuple[bytes, int]:
    """The diff with credential-looking content replaced, and how many replacements."""
    text = diff.decode("utf-8", errors="surrogateescape")
    redacted = redact_text(text)
    count = redacted.count(REDACTED) - text.count(REDACTED)
    return redacted.encode("utf-8", errors="surrogateescape"), count


def _untracked(root: Path) -> tuple[list[dict[str, Any]], int]:
    # repro500's own outputs (run directories, MLflow's store and its artifact roots, publications)
    # are never the experiment's state, whatever their path: capture/outputs.py tells them apart
    listed = git(root, "ls-files", "--others", "--exclude-standard", "-z") or b""
    names = OwnOutputs(root).select(sorted(
        name.decode("utf-8", errors="surrogateescape") for name in listed.split(b"\0") if name))
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


def _not_code(start: Path, root: Path) -> list[str]:
    """Pathspecs leaving out what DVC writes for the pipelines covering *start* (capture/dvcowned.py):
    a ``dvc exp run -S`` changes params.yaml and dvc.lock, and that is a parameter change, not dirty code."""
    from repro500.capture import dvcowned

    top = root.resolve()
    return [f":(top,exclude,literal){path.relative_to(top).as_posix()}" for path in dvcowned.owned(start, top)
            if path.is_relative_to(top) and path != top]


def describe_repo(path: str | Path | None = None) -> tuple[dict[str, Any], bytes]:
    """The code facet for the work tree containing ``path`` and the (redacted) diff bytes."""
    start = Path(path) if path is not None else Path.cwd()
    root = work_tree(start)
    if root is None:
        return {"in_repo": False, "reason": f"{start} is not inside a git work tree"}, b""
    # %H and %cI of HEAD; a repository without commits yet has none
    head = git(root, "log", "-1", "--format=%H%n%cI", "HEAD", "--", check=False)
    commit, commit_time = (head.decode().split("\n")[:2] if head else (None, None))
    ref = git(root, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    detached = ref is None
    branch = None if detached else ref.decode("utf-8", errors="surrogateescape").strip()
    configured = git(root, "config", "-z", "--get-regexp", r"^remote\..*\.url$", check=False) or b""
    remotes = []
    for item in filter(None, configured.decode("utf-8", errors="surrogateescape").split("\0")):
        key, _, url = item.partition("\n")
        remotes.append({"name": key[len("remote."):-len(".url")], "url": redact_url(url)})
    # --no-ext-diff/--no-color/--no-textconv: the user's git config must not change the bytes
    raw = git(root, "diff", commit or _EMPTY_TREE, "--binary", "--no-ext-diff", "--no-color", "--no-textconv",
              "--", ".", *_not_code(start, root)) or b""
    diff, redactions = redact_diff(raw)
    untracked, untracked_omitted = _untracked(root)
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
