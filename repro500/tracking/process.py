"""MLflow in a process of its own: :class:`repro500.tracking.client.Tracker` behind a socket.

Why a process and not a thread: MLflow's client import (about 0.9 s), its SQL store's opening
(about 0.5 s: SQLAlchemy's mappers, the schema check) and every logging call are Python work that
holds the GIL.  On a thread of the run's own process they stalled the first repeat's training loop:
logging cost 5-9 % of the quickstart's wall time (the target is at most 1 %).  A process of its
own, started when ``repro500 run`` starts (:func:`prestart`), imports MLflow on the core the run's
single-threaded start (the recipe, the plan, torch's import) leaves idle, and its logging never
holds the trainer's GIL.

Until :meth:`ProcessTracker.connect` names the store and the experiment the process only imports,
so a run refused for bad input has written nothing.  Calls are answered one at a time, in order
(runner/track.py makes them from its one worker thread); an exception in the process comes back as
itself when it is one of repro500's sentences (a ReproError), else as :class:`TrackingProcessError`
holding MLflow's first line with credentials removed.  The process is in its own process group
(Ctrl-C reaches the run only, which then ends the MLflow runs itself) and leaves when the run
closes the socket, or dies.

``REPRO500_MLFLOW_PROCESS=0`` keeps MLflow in the run's own process (on a thread), as a debugger
or a test that patches the Tracker needs.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

from repro500 import priority
from repro500.errors import ReproError
from repro500.tracking import store as mlflow_store

PROCESS_ENV = "REPRO500_MLFLOW_PROCESS"
_CONNECT = "__connect__"

_warm: ProcessTracker | None = None  # started by prestart(), taken by the run's first connect()


class TrackingProcessError(Exception):
    """An error inside the MLflow process, as one redacted clause (``str(err)``)."""


def in_process() -> bool:
    return os.environ.get(PROCESS_ENV, "1").strip().lower() in ("0", "false", "no", "off")


class ProcessTracker:
    """The run's side of the MLflow process: ``tracker.log_epoch(...)`` and every other
    :class:`~repro500.tracking.client.Tracker` method is sent there and answered."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            # The URI is never on the command line (``ps`` shows it, a database URI holds a password):
            # the process reads the same environment, and connect() sends the resolved one.
            # -P: the run's working directory is the user's project, whose own "repro500" folder (or any
            # module named like one MLflow loads) must not shadow ours in the logging process.
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "repro500.tracking.process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, process_group=0)
        finally:
            theirs.close()
        # Below the run's own priority: while a repeat trains on every core, an epoch's logging waits
        # for a gap rather than stall the training loop's threads (bench/mlflow_overhead.py). Set here,
        # as the process starts, not by the process itself once Python is up: a wrapped command's
        # first repeat begins while that process is still importing, and would share the CPU with it.
        priority.step_back(self._proc.pid)
        self._conn = Connection(ours.detach())
        # Popen.poll() answers None, "running", whenever another thread is inside poll() or wait(): the
        # run asks whether the process lives while the logging thread may be reading its exit status
        self._status_lock = threading.Lock()
        self._ready = False
        self.experiment_id: str | None = None
        self.notes: list[str] = []

    @property
    def alive(self) -> bool:
        return self._exit_status() is None

    def _exit_status(self, wait_s: float = 0.0) -> int | None:
        with self._status_lock:
            if not wait_s:
                return self._proc.poll()
            try:
                return self._proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                return None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def connect(self, experiment: str, uri: str, artifacts: str | None) -> ProcessTracker:
        self.experiment_id, self.notes = self._call(_CONNECT, experiment, uri, artifacts)
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return functools.partial(self._call, name)

    def death(self) -> TrackingProcessError | None:
        """Why the process stopped, or None while it runs."""
        return None if self.alive else self._stopped()

    def _stopped(self) -> TrackingProcessError:
        # its end of the socket closed: it is dying, and the kernel closes a killed process's files
        # before its exit status can be read, so wait a moment for the status (SIGKILL shows as -9)
        code = self._exit_status(wait_s=1.0)
        said = f"exit {code}" if code is not None else "no answer"
        return TrackingProcessError(f"the MLflow logging process stopped ({said})")

    def wait_ready(self) -> None:
        """Until the process has imported MLflow (it says so once, first)."""
        if not self._ready:
            try:
                self._conn.recv()
            except (EOFError, OSError):
                raise self._stopped() from None
            self._ready = True

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.wait_ready()
        try:
            self._conn.send((name, args, kwargs))
            ok, value = self._conn.recv()
        except (EOFError, OSError):
            raise self._stopped() from None
        if ok:
            return value
        raise value

    def close(self, timeout_s: float = 10.0) -> None:
        """Let the process finish (it has answered everything sent), or stop it after *timeout_s*."""
        with suppress(OSError):
            self._conn.send(None)
        if self._exit_status(wait_s=max(timeout_s, 1e-3)) is None:
            self._proc.kill()  # first: a thread still waiting for an answer gets EOF, not a closed socket
            with self._status_lock:
                self._proc.wait()
        self._conn.close()


def prestart() -> None:
    """Start the MLflow process now, ahead of the run that will most likely log to it (it only
    imports MLflow until a run connects; an untracked or refused run stops it at exit)."""
    global _warm
    if _warm is None and not in_process():
        import atexit

        _warm = ProcessTracker()
        atexit.unregister(discard)  # once, however many runs one process makes
        atexit.register(discard)


def discard() -> None:
    """Stop a prestarted process no run took."""
    global _warm
    if _warm is not None:
        warm, _warm = _warm, None
        warm.close(timeout_s=0)


def connect(experiment: str, uri: str, artifacts: str | None) -> Any:
    """A Tracker for *experiment* in the store *uri*: in the prestarted process (or a new one),
    or in this process with ``REPRO500_MLFLOW_PROCESS=0``."""
    global _warm
    if in_process():
        from repro500.tracking.client import Tracker

        return Tracker(experiment, uri, artifacts)
    tracker, _warm = _warm or ProcessTracker(), None
    try:
        return tracker.connect(experiment, uri, artifacts)
    except BaseException:
        tracker.close(timeout_s=0)
        raise


# ----- the process itself ------------------------------------------------------------------------
def _warm_up() -> None:
    """What every run needs, before any run asks: MLflow's client and, for a database store, its
    SQL layer; nothing is opened or written."""
    from mlflow.entities import Metric  # noqa: F401
    from mlflow.tracking import MlflowClient  # noqa: F401


    mlflow_store.quiet()

    if mlflow_store.tracking_uri().split(":", 1)[0].split("+", 1)[0] in ("sqlite", *mlflow_store.DATABASE_SCHEMES):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def _failure(err: BaseException) -> BaseException:
    if isinstance(err, ReproError):
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:  # noqa: BLE001 - a subclass with its own constructor: its sentence and code
            plain = ReproError(str(err))
            plain.exit_code = err.exit_code
            return plain
        return err
    return TrackingProcessError(mlflow_store.reason(err))


def _serve(conn: Connection) -> None:
    tracker: Any = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the run is gone
        if message is None:
            return
        name, args, kwargs = message
        try:
            if name == _CONNECT:
                from repro500.tracking.client import Tracker

                tracker = Tracker(*args)
                answer: tuple[bool, Any] = (True, (tracker.experiment_id, tracker.notes))
            else:
                answer = (True, getattr(tracker, name)(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - every failure is the caller's to report
            answer = (False, _failure(err))
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as err:  # noqa: BLE001 - an answer that does not pickle: say so instead
            conn.send((False, TrackingProcessError(f"{name} answered {type(err).__name__}: {err}")))


def main(argv: list[str]) -> None:
    # A batch system's TERM (SLURM signals every process of a job) or a Ctrl-C is the run's to
    # handle: it closes what it logged (a parent ends KILLED) through this process, which stops when
    # the run closes its socket, not when the signal arrives.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    with suppress(Exception):  # a failing import is met again, and reported, by the connect
        _warm_up()
    try:
        conn.send("ready")
    except OSError:
        os._exit(0)
    _serve(conn)
    # Everything sent is answered and committed; the interpreter's teardown of MLflow's and
    # SQLAlchemy's modules (~0.4 s) would only delay the run's exit, which waits for this one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # Run as the module's importable self, not as __main__: exceptions sent back must pickle under
    # repro500.tracking.process's names, which the run's process can import.
    from repro500.tracking import process as _module

    _module.main(sys.argv[1:])
