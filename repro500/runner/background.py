"""Work the runner does beside the repeats: the manifest's facets, MLflow, hashing what a
command read.  None of it is on the critical path of a repeat (wrapping a command
costs at most 5 % of running it by hand), and each result is collected where it is needed.

Daemon threads, not a ``ThreadPoolExecutor``: the interpreter joins an executor's threads at
exit, so a tracking server that hangs would hang ``repro500`` after a second Ctrl-C.  Everything
that must land is waited for explicitly (``Worker.drain``, ``Future.result``) before the run ends.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def call_in_background(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
    """Start ``fn(*args, **kwargs)`` on a thread of its own; its outcome is the returned future's."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
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


def warm_verify() -> None:
    """Import the verdict's statistics (numpy, scipy.special: about 0.5 s) while the repeats run: the process
    mostly waits on a wrapped command or a launcher there, so the closing verify no longer pays
    for it (the wrapping-cost budget)."""
    def load() -> None:
        with contextlib.suppress(Exception):
            import repro500.verify.verdict  # noqa: F401

    threading.Thread(target=load, name="repro500-warm-verify", daemon=True).start()
