"""``repro500 run --sandbox``: one's own run, started again inside bubblewrap (:mod:`repro500.sandbox`).

A run of one's own code is not confined unless asked: without ``--sandbox`` nothing here runs and
``repro500 run`` behaves and costs as it always did.  With it, the whole run (the runner, the
command or plug-ins, everything they start) runs in the sandbox ``reproduce --run-code`` gives a
publication's code, granted what an own run needs: the working directory (the experiment's
source and its relative data) and the recipe, the params file, the ``--input`` paths and the
``--against`` reference read-only; the ``--out`` directory (or the ``--resume`` run) and the local
MLflow store's directory (``mlflow.db`` in the working directory by default: then the working
directory is writable) writable; the network only with ``--network``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from repro500 import sandbox
from repro500.errors import InvalidInput, UsageError
from repro500.tracking import store as mlflow_store


def inside() -> bool:
    """Whether this process already runs in the sandbox a ``run --sandbox`` started it in."""
    return bool(sandbox.recorded().get("sandboxed"))


def grants(*, out_dir: str, resume: str | None, tracking: bool | None, artifacts: str | None,
           reads: Iterable[str | None], network: bool, extra: Iterable[str]) -> sandbox.Grants:
    """What an own run gets in its sandbox (see the module docstring)."""
    write = [Path(resume) if resume else Path(out_dir)]
    db = mlflow_store.sqlite_path(mlflow_store.tracking_uri()) if tracking is not False else None
    if db is not None:
        write.append(db.absolute().parent)  # SQLite writes its journal beside the database; mlartifacts/ too
    if artifacts and "://" not in artifacts:
        write.append(Path(artifacts))
    for path in write:
        path.absolute().mkdir(parents=True, exist_ok=True)
    written = {p.absolute() for p in write}
    # the working directory holding the MLflow store is written, not only read: the store's grant wins
    read = [p.absolute() for p in (Path.cwd(), *(Path(p) for p in reads if p)) if p.absolute() not in written]
    return sandbox.Grants(read=tuple(read), write=tuple(p.absolute() for p in write),
                          network=network, extra=tuple(Path(p).absolute() for p in extra))


def run_again_inside(granted: sandbox.Grants, console: Any = None) -> int:
    """This ``repro500 run`` started again inside the sandbox, its exit status: the same arguments
    (the inner run sees it is inside and runs), the plan line on stderr first."""
    environ = dict(os.environ)
    record = sandbox.record(granted, environ)
    print(sandbox.plan_line(granted).replace("the code", "your code"), file=sys.stderr, flush=True)
    env = {**environ, sandbox.RECORD_ENV: sandbox.encoded(record)}
    argv = [*sandbox.wrap(granted, env, cwd=Path.cwd()), sys.executable, "-m", "repro500.cli", *sys.argv[1:]]
    return wait(subprocess.Popen(argv, env=sandbox.environment(env), process_group=0))


def wait(proc: subprocess.Popen[bytes]) -> int:
    """*proc*'s exit status; Ctrl-C (or SIGTERM) here is passed to the run inside once, which closes
    its records (a third kills it), as ``repro500 run`` itself would take it."""
    return sandbox.wait_passing_signals(proc, sandboxed=True)


def check(sandboxed: bool, network: bool, extra: Iterable[str], sign_key_given: bool) -> None:
    """The sandbox's options of ``repro500 run``, checked before anything is written."""
    extra = list(extra)
    if not sandboxed and (network or extra):
        raise UsageError(f"{'--network' if network else '--sandbox-ro'} widens the sandbox of --sandbox: pass "
                         "--sandbox too, or leave it out")
    if not sandboxed:
        return
    if sign_key_given:
        raise UsageError("--sign-key reads your private key, which a sandboxed run is not granted: sign the run "
                         "afterwards with repro500 sign RUN")
    sandbox.check_extra(Path(p) for p in extra)
    why = sandbox.unavailable("--sandbox runs your code in bubblewrap", "run it without --sandbox")
    if why is not None:
        raise InvalidInput(why)
