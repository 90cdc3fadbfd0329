"""Work the runner does beside the repeats: the manifest's facets, MLflow, hashing what a
command read.  None of it is on the critical path of a repeat (wrapping a command
costs at most 2 % of running it by hand), and each result is collected where it is needed.

Daemon threads, not a ``ThreadPoolExecutor``: the interpreter joins an executor's threads at
exit, so a tracking server that hangs would hang ``repro500`` after a second Ctrl-C.  Everything
that must land is waited for explicitly (``Worker.drain``, ``Future.result``) before the run ends.
"""

from __future__ import annotations

import importlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from repro500 import priority

# The runner's own background work steps back (repro500/priority.py) while the experiment runs in
# processes of its own (a wrapped command), as the MLflow process does: on two cores the manifest's
# facets and the verdict's imports fell on the first repeat beside MLflow's start, and took CPU
# from the user's processes (a 5 s script ran 0.1-0.15 s longer). Not while the experiment trains
# in this process: a thread holding the GIL while the scheduler keeps it waiting would hold up the
# training loop.


def yields_cpu(recipe: Any) -> bool:
    """Whether the runner's background work steps back for this recipe's experiment: a wrapped
    command runs in processes of its own, while the trainer's repeats run in the runner's."""
    return bool(recipe.is_command)


# Stepping back is not enough before the experiment's process exists: on two cores the runner's
# main thread (starting that process) and a background thread each have a core, and share the GIL
# (the background work is Python: hashing files, reading 200 distributions' metadata, importing
# numpy), so the main thread ran at about half speed until the first repeat started. A wrapped
# command's background work therefore waits for that start (``after``, set by the session).


def _step_back() -> None:
    """Lower the calling thread's CPU priority (Linux schedules threads one by one, and what a
    thread starts inherits its priority)."""
    priority.step_back(threading.get_native_id())


def call_in_background(name: str, fn: Callable[..., Any], *args: Any, yielding: bool = False,
                       after: threading.Event | None = None, **kwargs: Any) -> Future[Any]:
    """Start ``fn(*args, **kwargs)`` on a thread of its own (at a lower CPU priority when
    *yielding*, once *after* is set when given); its outcome is the returned future's."""
    future: Future[Any] = Future()

    def run() -> None:
        if after is not None:
            after.wait()
        if not future.set_running_or_notify_cancel():
            return
        if yielding:
            _step_back()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - handed to whoever collects the result
            future.set_exception(err)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class Worker:
    """One daemon thread that runs submitted calls one after another, in submission order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue[tuple[Future[Any], Callable[[], Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as err:  # noqa: BLE001 - handed to whoever collects the result
                    future.set_exception(err)
            self._queue.task_done()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, lambda: fn(*args, **kwargs)))
        return future

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every call submitted so far has run; False when *timeout_s* passed first."""
        marker = self.submit(lambda: None)
        try:
            marker.result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def stop(self) -> None:
        self._queue.put(None)


def warm_verify(yielding: bool = False, after: threading.Event | None = None) -> None:
    """Import the verdict's statistics (numpy, scipy.special: about 0.5 s) while the repeats run
    (once *after* is set when given): the process mostly waits on a wrapped command or a launcher
    there, so the closing verify no longer pays for it (the wrapping-cost budget).  A failed
    import is met again, and reported, by the verify itself."""
    call_in_background("repro500-warm-verify", importlib.import_module, "repro500.verify.verdict",
                       yielding=yielding, after=after)
