"""What a reproduction grants the publisher's code it runs (``--run-code``): the sandbox's options
checked before anything is written, the grants of the rerun and of the installs of ``--env venv``,
and the command that starts them confined.  The sandbox itself is :mod:`repro500.sandbox`'s.

The rerun (``repro500 run`` of the publication's recipe, a child of ``reproduce``) runs whole in
the sandbox: the publisher's command, plug-ins imported by the runner, and everything they start.
It may read the publication's copy, the source snapshot (``OUT/source``), the rebuilt environment
(``OUT/env``) and the checked data, write the reproduction's own directory (``OUT``: the rerun, its
MLflow store) but none of those inside it; a local MLflow store named by ``MLFLOW_TRACKING_URI``
elsewhere is granted its directory, a remote one needs ``--network``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500 import sandbox, untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.publish.rebuild.install import tool_requirement
from repro500.tracking import store as mlflow_store


@dataclass(frozen=True)
class Choice:
    """The reproducer's sandbox options, checked: ``grants`` None when unconfined."""

    confined: bool
    network: bool = False
    extra: tuple[Path, ...] = ()
    consent: str | None = None  # "--no-sandbox" when the reproducer chose to run unconfined

    def record(self, grants: sandbox.Grants | None, environ: Mapping[str, str]) -> dict[str, Any]:
        return sandbox.record(grants if self.confined else None, environ, consent=self.consent)


def choose(run_code: bool, no_sandbox: bool, network: bool, read_only: Iterable[str | Path]) -> Choice:
    """The options checked, and bwrap asked whether it can sandbox here, before anything is written:
    UsageError for an option that needs another; InvalidInput (exit 4) naming the package to install
    when code would run and cannot be confined, unless ``--no-sandbox``."""
    extra = tuple(Path(p) for p in read_only)
    if not run_code:
        given = [flag for flag, on in (("--no-sandbox", no_sandbox), ("--network", network),
                                       ("--sandbox-ro", bool(extra))) if on]
        if given:
            raise UsageError(f"{given[0]} sets the sandbox of the publication's code, which runs only with "
                             "--run-code: pass --run-code too, or leave it out")
        return Choice(confined=False)
    if no_sandbox:
        if network or extra:
            raise UsageError(f"{'--network' if network else '--sandbox-ro'} widens the sandbox, and --no-sandbox "
                             "runs the code without one: choose one of them")
        return Choice(confined=False, consent="--no-sandbox")
    for path in extra:
        if not path.exists():
            raise UsageError(f"--sandbox-ro {untrusted.shown(path)} does not exist: name a file or directory to "
                             "grant the code read access to")
    why = sandbox.unavailable()
    if why is not None:
        raise InvalidInput(why)
    return Choice(confined=True, network=network, extra=tuple(p.absolute() for p in extra))


def rerun_grants(choice: Choice, workdir: Path, reads: Iterable[Path], environ: Mapping[str, str]) -> sandbox.Grants:
    """The rerun's grants: ``OUT`` writable, and read-only inside or beside it the publication, the
    source snapshot, the rebuilt environment and *reads* (the checked data, the command's inputs)."""
    out = workdir.absolute()
    read = [out / "publication", out / "source", out / "env", *(Path(p).absolute() for p in reads)]
    write = [out]
    db = mlflow_store.sqlite_path(environ.get("MLFLOW_TRACKING_URI", "")) if environ.get("MLFLOW_TRACKING_URI") else None
    if db is not None and not db.absolute().is_relative_to(out):
        write.append(db.absolute().parent)  # a local store of the reproducer's: its directory
    return sandbox.Grants(read=tuple(read), write=tuple(write), network=choice.network, extra=choice.extra)


def install_grants(choice: Choice, env_dir: Path, reads: Iterable[Path]) -> sandbox.Grants:
    """The installs of ``--env venv``: the network (the index) whatever ``--network`` says, ``OUT/env``
    and its own download cache beside it writable (never the reproducer's cache, which the build code
    could poison), and *reads* read-only: ``OUT/source``, ``--find-links`` folders, the Python the venv
    is made from, the local folders the reproducer's ``PIP_FIND_LINKS`` / ``UV_FIND_LINKS`` name."""
    env_dir = env_dir.absolute()
    cache = env_dir.parent / "env-cache"
    cache.mkdir(parents=True, exist_ok=True)
    named = [Path(word) for var in ("PIP_FIND_LINKS", "UV_FIND_LINKS")
             for word in os.environ.get(var, "").replace(",", " ").split() if word.startswith("/")]
    return sandbox.Grants(read=tuple(Path(p).absolute() for p in (*reads, *named)), write=(env_dir, cache),
                          network=True, extra=choice.extra,
                          setenv={"UV_CACHE_DIR": str(cache), "PIP_CACHE_DIR": str(cache)})


def installs(choice: Choice, workdir: Path, reads: Iterable[Path | str | None]) -> Callable[[str], list[str]] | None:
    """For ``--env venv``: given the Python the venv is made from, the argv prefix that runs an install
    in the sandbox (:func:`install_grants`); None when the code runs unconfined."""
    if not choice.confined:
        return None
    # a built-in recipe's venv gets the repro500 running now, from its checkout when installed from one
    tool = [Path(word) for word in tool_requirement()[0] if word.startswith("/")]
    folders = [Path(p) for p in (*reads, *tool) if p is not None]

    def prefix(python: str) -> list[str]:
        base = Path(python).resolve().parent.parent
        grants = install_grants(choice, workdir / "env", [*folders, base])
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

