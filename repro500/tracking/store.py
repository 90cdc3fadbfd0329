"""Where the MLflow tracking store is, and whether it can be used: one home for the store's
location (``MLFLOW_TRACKING_URI`` or MLflow's default SQLite file), the files a local store is
made of, the lock around a new store's creation, and the checks a run makes before any work.
Nothing here imports MLflow unless it must: the runner asks these questions on its critical path.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput, UsageError
from repro500.redact import redact_text, redact_url

DEFAULT_STORE = "mlflow.db"
# Database stores MLflow opens through SQLAlchemy (besides SQLite): checked with one connection first.
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
# SQLite keeps these beside a database while it is written; ".lock" is what earlier versions of
# store_lock left there (it now locks the directory and leaves nothing).
SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm", ".lock")


def quiet() -> None:
    """MLflow's INFO lines ("Creating initial MLflow database tables ...") kept out of repro500's
    own output, unless the user asked for a level (MLFLOW_LOGGING_LEVEL); a wrapped command's own
    MLflow logs as it always does (its environment is not changed)."""
    import logging

    if not os.environ.get("MLFLOW_LOGGING_LEVEL"):
        logging.getLogger("mlflow").setLevel(logging.WARNING)


def tracking_uri() -> str:
    """The tracking URI in effect: ``MLFLOW_TRACKING_URI``, else MLflow's default SQLite store
    ``mlflow.db`` in the working directory; a relative SQLite path is made absolute, so a command
    running in another directory logs into the same file.

    Read without importing MLflow (1-2 s on the critical path of every run).  MLflow's own
    ``get_tracking_uri`` gives the same, except where ``./mlruns`` holds a legacy file store,
    which MLflow >= 3.13 no longer opens: repro500 then uses ``mlflow.db`` beside it.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{DEFAULT_STORE}"
    db = sqlite_path(uri)
    if db is not None and not db.is_absolute():
        query = uri.partition("?")[2]
        uri = f"sqlite:///{Path.cwd() / db}" + (f"?{query}" if query else "")
    return uri


def local_store_paths(uri: str) -> list[Path]:
    """The files a local tracking store consists of (a SQLite database and its side files), which
    are repro500's output and never the experiment's source; none for a server."""
    db = sqlite_path(uri)
    if db is None:
        if uri.startswith("file:"):
            return [Path(uri.removeprefix("file://").removeprefix("file:")).resolve()]
        return []
    db = db.resolve()
    return [db, *(db.with_name(db.name + side) for side in SQLITE_SIDE_FILES)]


@contextlib.contextmanager
def _http_settings(settings: dict[str, str], *, override: bool) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in settings}
    for key, value in settings.items():
        if override or not os.environ.get(key):
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def fast_failing_http() -> contextlib.AbstractContextManager[None]:
    """For the one look that decides whether a store is there at all: MLflow retries an unreachable
    server with back-off for minutes, the pre-flight must not (HEALTH_CONNECT_S, no retry, whatever
    is set)."""
    return _http_settings({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                           "MLFLOW_HTTP_REQUEST_TIMEOUT": str(HEALTH_CONNECT_S)},
                          override=True)


def patient_http() -> contextlib.AbstractContextManager[None]:
    """For reads from a store that has answered: a server busy with other machines' runs gets
    HEALTH_ANSWER_S an answer and two retries, so slowness is never read as a record that is not
    there (the user's own MLFLOW_HTTP_REQUEST_* settings, where set, are kept)."""
    return _http_settings({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                           "MLFLOW_HTTP_REQUEST_TIMEOUT": str(HEALTH_ANSWER_S)}, override=False)


def read_run(client: Any, run_id: str, uri: str) -> Any:
    """Run *run_id* of the store at *uri*, or None where the store says it holds no such run.  Any
    other failure (a timeout, a server error, a lost connection) is not an answer about the run:
    InvalidInput saying it could not be read, never "not there"."""
    from mlflow.exceptions import MlflowException

    try:
        with patient_http():
            return client.get_run(run_id)
    except MlflowException as err:
        if getattr(err, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise InvalidInput(f"MLflow run {run_id} could not be read from {safe_uri(uri)} ({reason(err)})") from None


def safe_uri(uri: str) -> str:
    return redact_url(uri)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative or ``sqlite:////absolute``), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float = 300.0) -> Iterator[None]:
    """Hold an exclusive lock on the directory of a SQLite store while its schema is created or upgraded.

    MLflow creates and migrates the schema when a process first opens a store; several processes
    doing that at once on a new file race ("duplicate column name", "Online migration expected to
    match one row").  Serialising the first open is enough: MLflow keeps the store per process.
    The lock is ``flock`` on the directory itself, so nothing is left beside the database (a
    ``<db>.lock`` file would stay after every run: deleting a lock file on release races with the
    next process that opened it).  Other stores (servers, databases with their own locking) are
    not locked.
    """
    import fcntl

    db = sqlite_path(uri)
    if db is None:
        yield
        return
    try:
        fd = os.open(db.parent if str(db.parent) else ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # no directory yet, or none we may read: MLflow's own open says what is wrong
        yield
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InvalidInput(f"MLflow tracking store {safe_uri(uri)} stayed locked for {timeout_s:.0f} s by "
                                       "another process creating its tables; try again, or run with --no-tracking") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


# The largest sealed run copied into the store as one archive (tracking.client.log_sealed)
SEALED_MAX_ENV, SEALED_MAX_MB = "REPRO500_MLFLOW_SEALED_MAX_MB", 2048


def sealed_limit_mb() -> float:
    """``REPRO500_MLFLOW_SEALED_MAX_MB`` (default 2048): checked before a run starts."""
    import math

    text = os.environ.get(SEALED_MAX_ENV) or str(SEALED_MAX_MB)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{SEALED_MAX_ENV}={text!r} is not a size in MiB (a number >= 0, e.g. 2048)")
    return value


def default_artifacts(uri: str) -> str | None:
    """Where the artifacts of the experiments repro500 creates go unless ``--artifacts`` says:
    ``mlartifacts/`` beside a SQLite store (MLflow would use ``./mlruns`` of whatever directory
    the run started in, so runs of one store scattered their files); a tracking server or a
    database decides for itself (a server's ``--artifacts-destination``), so None."""
    db = sqlite_path(uri)
    return str(db.resolve().parent / "mlartifacts") if db is not None else None


def artifact_uri(location: str | None) -> str | None:
    """*location* as MLflow records an experiment's artifact location (a local path made absolute)."""
    if not location:
        return location
    from mlflow.utils.uri import resolve_uri_if_local

    return str(resolve_uri_if_local(location)).rstrip("/")


def open_store(uri: str, artifacts: str | None = None) -> None:
    """Open (and on first use create or upgrade) the tracking store of *uri* in this process, under
    :func:`store_lock`, so concurrent first use of a new SQLite file works.  A store created here
    puts its Default experiment's artifacts in *artifacts*."""
    from mlflow.tracking._tracking_service.utils import _get_store

    with store_lock(uri):
        db = sqlite_path(uri)
        if artifacts and db is not None and not db.exists():  # created now: its Default experiment too
            _get_store(uri, artifacts)
        # MLflow keeps one store per (URI, artifact root): the client's, opened once (a second
        # SQLAlchemy store would cost its engine and schema check again, ~0.4 s)
        _get_store(uri)


def reason(err: BaseException) -> str:
    """MLflow's error as one short clause, with credentials it quotes (the URI with its password) removed."""
    text = str(err).strip()
    return redact_text(text.splitlines()[0][:200]) if text else type(err).__name__


def _check_database(uri: str, unreachable: str) -> None:
    """One connection to a database store, 5 s at most, before MLflow opens it: MLflow retries a
    database it cannot open ten times with back-off (about 100 s), logging every failure, so a
    wrong password or a server that is down would take minutes and many lines instead of one."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    # libpq and PyMySQL both take connect_timeout; without it a silent host blocks for minutes
    connect_args = {"connect_timeout": 5} if scheme in ("postgresql", "mysql") else {}
    engine = None
    try:
        engine = sqlalchemy.create_engine(uri, poolclass=NullPool, connect_args=connect_args)
        with engine.connect():
            pass
    except ModuleNotFoundError as err:  # SQLAlchemy >= 2.1 reads postgresql:// as psycopg 3
        raise InvalidInput(unreachable.format(
            f"its database driver {err.name} is not installed: install it, or name an installed one in "
            "the URI, e.g. postgresql+psycopg2:// with psycopg2-binary")) from None
    except Exception as err:  # noqa: BLE001 - any failure to connect means "unreachable"
        raise InvalidInput(unreachable.format(reason(err))) from None
    finally:
        if engine is not None:
            engine.dispose()


def _check_directory(uri: str, db: Path) -> None:
    parent = db.parent if str(db.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InvalidInput(f"MLflow tracking store {safe_uri(uri)} is not writable: directory {parent} does not exist "
                           "or is read-only")


def check_reachable() -> str:
    """Fail fast, before any training, when the tracking store cannot be used (a database server:
    one connection of 5 s at most before MLflow's own retries). Returns the URI."""
    uri = tracking_uri()
    db_path = sqlite_path(uri)
    if db_path is not None:
        _check_directory(uri, db_path)
    if uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES:
        _check_database(uri, f"MLflow tracking store {safe_uri(uri)} is unreachable ({{}}); check "
                             "MLFLOW_TRACKING_URI or run with --no-tracking")
    # imported after the database check: importing MLflow takes seconds
    from mlflow.tracking import MlflowClient

    try:
        with fast_failing_http():
            open_store(uri)
            MlflowClient(uri).search_experiments(max_results=1)
    except InvalidInput:
        raise
    except Exception as err:  # noqa: BLE001 - any failure here means "unreachable"
        raise InvalidInput(
            f"MLflow tracking store {safe_uri(uri)} is unreachable ({reason(err)}); check MLFLOW_TRACKING_URI "
            "or run with --no-tracking"
        ) from None
    return uri


def check_readable(uri: str, advice: str = "check MLFLOW_TRACKING_URI") -> None:
    """Fail fast when an existing store cannot be read (``verify mlflow:RUN_ID``, ``--check-tracking``):
    a database server gets one connection of 5 s at most; a tracking server 5 s to take the
    connection, and once it has, :data:`HEALTH_ANSWER_S` to answer (a busy server is there)."""
    unreachable = f"MLflow tracking store {safe_uri(uri)} is unreachable ({{}}); {advice}"
    if uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES:
        _check_database(uri, unreachable)
    # a tracking server that took the connection but is busy gets its time on /health first: the
    # search below then meets a server that has answered, and gets patience, not 5 s
    answered = uri.startswith(("http://", "https://")) and _answers_health(uri, unreachable)
    from mlflow.tracking import MlflowClient

    try:
        with patient_http() if answered else fast_failing_http():
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:  # noqa: BLE001 - any failure here means "unreachable"
        raise InvalidInput(unreachable.format(reason(err))) from None


# A host that does not take the connection within HEALTH_CONNECT_S is unreachable; a server that took it
# but is busy (other machines' runs logging to it, its database slow) is there, and gets HEALTH_ANSWER_S
# more to answer before the run is refused.
HEALTH_CONNECT_S = 5
HEALTH_ANSWER_S = 60


def _answers_health(uri: str, unreachable: str) -> bool:
    """Whether an HTTP tracking server answers MLflow's ``/health`` with 200; False where something
    else answers (a proxy, an auth layer) and MLflow itself must decide. Refuses a server that cannot
    be reached."""
    import urllib.error  # not before a local store's run: urllib.request brings http, ssl and email
    import urllib.request

    for timeout in (HEALTH_CONNECT_S, HEALTH_ANSWER_S):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as answer:  # noqa: S310 - the user's server
                return answer.status == 200
        except urllib.error.HTTPError:
            return False
        except urllib.error.URLError as err:  # the connection itself failed (urllib wraps only that)
            raise InvalidInput(unreachable.format(reason(getattr(err, "reason", err)))) from None
        except TimeoutError:
            continue  # connected, no answer yet: a busy server gets the longer wait
        except OSError as err:
            raise InvalidInput(unreachable.format(reason(err))) from None
        except Exception:  # noqa: BLE001 - a URL urllib cannot parse: MLflow decides
            return False
    raise InvalidInput(unreachable.format(
        f"it took the connection but did not answer /health within {HEALTH_CONNECT_S + HEALTH_ANSWER_S} s"))


def check_usable(uri: str | None = None) -> str:
    """:func:`check_reachable` without importing MLflow where a cheaper look decides: a local
    SQLite file (its directory writable, the file a SQLite database or new) or an HTTP server
    that answers MLflow's ``/health``.  Other stores get the full check (a database server: one
    quick connection first).  Returns the URI."""
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:  # found, not imported: the logging process imports it
        raise InvalidInput(f"MLflow is not installed in this Python ({sys.executable}): pip install mlflow, "
                           "or run with --no-tracking")
    uri = uri or tracking_uri()
    unreachable = (f"MLflow tracking store {safe_uri(uri)} is unreachable ({{}}); check MLFLOW_TRACKING_URI "
                   "or run with --no-tracking")
    db = sqlite_path(uri)
    if db is not None:
        _check_directory(uri, db)
        if db.exists():
            try:
                with open(db, "rb") as fh:
                    head = fh.read(16)
            except OSError as err:
                raise InvalidInput(unreachable.format(err.strerror or err)) from None
            if head and head != b"SQLite format 3\0":
                raise InvalidInput(unreachable.format(f"{db} is not an SQLite database"))
            if not os.access(db, os.W_OK):
                raise InvalidInput(f"MLflow tracking store {safe_uri(uri)} is not writable: {db} is read-only")
        return uri
    # A URL with credentials in it (user:password@host) is MLflow's to open: urllib takes them for a port.
    if uri.startswith(("http://", "https://")) and "@" not in uri.split("/", 3)[2] and _answers_health(uri, unreachable):
        return uri
    return check_reachable()
