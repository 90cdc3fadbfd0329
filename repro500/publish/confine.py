"""What a reproduction grants the publisher's code it runs (``--run-code``): the grants of the rerun
and of the installs of ``--env venv``, and the command that starts them confined.  The sandbox and
its options are :mod:`repro500.sandbox`'s.

The rerun (``repro500 run`` of the publication's recipe, a child of ``reproduce``) runs whole in
the sandbox: the publisher's command, plug-ins imported by the runner, and everything they start.
It may read the publication's copy, the source snapshot (``OUT/source``), the rebuilt environment
(``OUT/env``) and the checked data, write the reproduction's own directory (``OUT``: the rerun, its
MLflow store) but none of those inside it; a local MLflow store named by ``MLFLOW_TRACKING_URI``
elsewhere is granted its directory, a remote one needs ``--network``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from repro500 import sandbox, untrusted
from repro500.publish.rebuild.install import CACHE_DIR
from repro500.tracking import store as mlflow_store


def rerun_grants(choice: sandbox.Choice, workdir: Path, reads: Iterable[Path], environ: Mapping[str, str]) -> sandbox.Grants:
    """The rerun's grants: ``OUT`` writable, and read-only inside or beside it the publication, the
    source snapshot, the rebuilt environment and *reads* (the checked data, the command's inputs)."""
    out = workdir.absolute()
    read = [out / "publication", out / "source", out / "env", *(Path(p).absolute() for p in reads)]
    write = [out]
    db = mlflow_store.sqlite_path(environ.get("MLFLOW_TRACKING_URI", "")) if environ.get("MLFLOW_TRACKING_URI") else None
    if db is not None and not db.absolute().is_relative_to(out):
        write.append(db.absolute().parent)  # a local store of the reproducer's: its directory
    return sandbox.Grants(read=tuple(read), write=tuple(write), network=choice.network, extra=choice.extra)


def install_grants(choice: sandbox.Choice, env_dir: Path, reads: Iterable[Path],
                   scratch: Iterable[tuple[Path, Path]] = ()) -> sandbox.Grants:
    """The installs of ``--env venv``: the network (the index) whatever ``--network`` says, ``OUT/env``
    and its own download cache beside it writable (never the reproducer's cache, which the build code
    could poison), *reads* read-only (``--find-links`` folders, the Python the venv is made from, the
    local folders the reproducer's ``PIP_FIND_LINKS`` / ``UV_FIND_LINKS`` name) and *scratch*:
    (path, copy) pairs, ``OUT/source`` seen through a throwaway copy."""
    env_dir = env_dir.absolute()
    cache = env_dir.parent / CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    named = [Path(word) for var in ("PIP_FIND_LINKS", "UV_FIND_LINKS")
             for word in os.environ.get(var, "").replace(",", " ").split() if word.startswith("/")]
    return sandbox.Grants(read=tuple(Path(p).absolute() for p in (*reads, *named)), write=(env_dir, cache),
                          network=True, extra=choice.extra, scratch=tuple(scratch),
                          setenv={"UV_CACHE_DIR": str(cache), "PIP_CACHE_DIR": str(cache)})


def installs(choice: sandbox.Choice, workdir: Path, source: Path | None,
             reads: Iterable[Path | str]) -> Callable[[str], list[str]] | None:
    """For ``--env venv``: given the Python the venv is made from, the argv prefix that runs an install
    in the sandbox (:func:`install_grants`); None when the code runs unconfined.  The experiment's own
    package is built from *source* (``OUT/source``), which must stay as it was checked; a build
    backend writes beside the sources it builds (setuptools' egg-info), so the installs see a copy
    of it there instead (``OUT/env-cache/source-scratch``, made afresh for each rebuild), which takes
    what they write: an editable install still points at ``OUT/source``, where the same bytes are."""
    if not choice.confined:
        return None
    folders = [Path(p) for p in reads]

    def prefix(python: str) -> list[str]:
        base = Path(python).resolve().parent.parent
        scratch = []
        if source is not None:
            copy = workdir.absolute() / CACHE_DIR / "source-scratch"
            if copy.exists():
                shutil.rmtree(copy)
            shutil.copytree(source, copy, symlinks=True)
            scratch.append((source.absolute(), copy))
        grants = install_grants(choice, workdir / "env", [*folders, base], scratch)
        return sandbox.wrap(grants, os.environ)

    return prefix


def command(cmd: list[str], cwd: Path, env: dict[str, str], grants: sandbox.Grants | None,
            record: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that start *cmd* in *cwd*: inside bubblewrap with *grants*, or as it is
    (None); either way the run records *record* in its manifest (its ``sandbox`` facet)."""
    env = {**env, sandbox.RECORD_ENV: sandbox.encoded(record)}
    if grants is None:
        return cmd, env
    for path in grants.write:
        Path(path).mkdir(parents=True, exist_ok=True)
    return [*sandbox.wrap(grants, env, cwd=cwd), *cmd], sandbox.environment(env)


def labels(workdir: Path) -> dict[str, str]:
    """The rerun's granted paths as the plan line names them."""
    out = workdir.absolute()
    return {str(out): f"{workdir} (the reproduction's own directory)", str(out / "publication"): "the publication",
            str(out / "source"): "the source snapshot (OUT/source)", str(out / "env"): "the rebuilt environment"}



def rerun(choice: sandbox.Choice, workdir: Path, reads: Iterable[Path], environ: Mapping[str, str],
          used: Mapping[str, Any], console: Any) -> tuple[sandbox.Grants | None, dict[str, Any]]:
    """(the rerun's grants or None, what its manifest records of them), the plan line said when the
    publisher's code runs (``--run-code``); *reads*: the checked data and the command's inputs,
    *used*: the environment the rerun runs in (a rebuilt venv's Python was made from another)."""
    if not choice.confined and choice.consent is None:
        return None, choice.record(None, environ)
    reads = list(reads)
    if used.get("mode") == "venv":  # the Python the rebuilt venv was made from (its bin/python links there)
        reads.append(Path(str(used["python"])).resolve().parent.parent)
    grants = rerun_grants(choice, workdir, reads, environ) if choice.confined else None
    console.print(untrusted.shown(sandbox.plan_line(grants, labels(workdir)), untrusted.SENTENCE_CHARS), highlight=False,
                  soft_wrap=True)
    return grants, choice.record(grants, environ)


def said(record: Mapping[str, Any] | None) -> str | None:
    """The line under the verdict: a rerun that ran without the sandbox (the second consent), or in it."""
    if record and record.get("consent"):
        return ("sandbox: the rerun ran WITHOUT the sandbox (--no-sandbox): the publication's code had your "
                "user's rights (files, environment, network)")
    if record and record.get("sandboxed"):
        return f"sandbox: the rerun ran in bubblewrap ({'with' if record.get('network') else 'no'} network)"
    return None
