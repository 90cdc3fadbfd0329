"""New MLflow stores for tests whose subject is what a run logs, not how a store comes to be.

Creating a SQLite store runs MLflow's schema migrations, about 1.5 s of CPU each time (2-core
Intel Xeon), and some thirty tests each logged into a store of their own.  ``mlflow_store`` makes
one store per test process the way repro500 makes one (``tracking.store.open_store``: the Default
experiment's artifacts in ``mlartifacts/`` beside the file) and copies it, pointing the copy's
Default experiment at its own ``mlartifacts/``.  The tests of creating a store (its lock, four
clients at once, a store that must not be created) make theirs the real way.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import sqlite3
import tempfile
from pathlib import Path


@functools.cache
def _template() -> Path:
    from repro500.tracking.store import default_artifacts, open_store

    folder = Path(tempfile.mkdtemp(prefix="repro500-test-store-"))
    atexit.register(shutil.rmtree, folder, True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    open_store(uri, default_artifacts(uri))
    return folder / "mlflow.db"


def mlflow_store(path: Path) -> str:
    """The URI of a new, empty SQLite store at *path* (a file that must not exist yet), as
    repro500 would have created it there."""
    from repro500.tracking.store import default_artifacts

    if path.exists():
        raise FileExistsError(path)
    template = _template()
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, path)
    uri = f"sqlite:///{path}"
    theirs, mine = default_artifacts(f"sqlite:///{template}"), default_artifacts(uri)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (location,) = db.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()
        assert location.startswith(theirs), location  # the Default experiment's, as open_store made it
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                   (mine + location[len(theirs):],))
    return uri
