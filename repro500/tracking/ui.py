"""``repro500 ui``: MLflow's own UI on the tracking store repro500 logs to, on loopback.

The UI is MLflow's (``mlflow server``); repro500 only points it at the right store, binds it
to 127.0.0.1 by default (a team server is documented in docs/team.md) and waits until it
answers before printing the URL.  The server runs in its own process group; SIGINT, SIGTERM
and SIGHUP sent to ``repro500 ui`` (Ctrl-C, ``kill``, a service manager, a batch system, a
closed terminal) are passed on to that whole group and waited for, so nothing is left
answering on the port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from repro500.errors import InvalidInput, UsageError
from repro500.redact import redact_url
from repro500.tracking.names import RUN_ID_TAG, VIEW_PARAM, VIEW_TAG

HEALTH_TIMEOUT_S = 120.0
# MLflow's UI (3.17) lays an experiment's page out by its GenAI / Model training switch, kept in the
# browser and GenAI until the user flips it, not by the experiment's mlflow.experimentKind tag: a
# bare address opens repro500's experiments on an empty traces overview. This query opens the
# runs table (the verdict and metrics) whatever the browser has stored.
RUNS_VIEW = "workflowType=machine_learning"


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def server_command(backend_uri: str, host: str, port: int, artifacts: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
           "--host", host, "--port", str(port), "--workers", "1"]
    if artifacts:
        cmd += ["--artifacts-destination", artifacts]
    return cmd


def default_backend_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when it names a database, else the default ``sqlite:///mlflow.db``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://")):
        raise UsageError(
            f"MLFLOW_TRACKING_URI points at a tracking server ({uri.split('@')[-1]}); open that server's UI "
            "instead of starting one"
        )
    if uri:
        return uri
    return f"sqlite:///{Path('mlflow.db').resolve()}"


def redact_store(uri: str) -> str:
    """The store URI as it may be printed (a database password removed)."""
    return redact_url(uri)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Poll ``/health`` until the server answers 200, the process dies, or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise InvalidInput(f"the MLflow UI exited with code {proc.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise InvalidInput(f"the MLflow UI did not answer at {url} within {timeout_s:.0f} s")


def _api(url: str, method: str, payload: dict) -> dict:
    import json

    request = urllib.request.Request(f"{url}/api/2.0/mlflow/{method}", data=json.dumps(payload).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def runs_page(url: str) -> str:
    """The address to open: the runs table of the experiment that holds the latest repro500 run,
    else the experiments list, both in MLflow's model-training view (:data:`RUNS_VIEW`)."""
    try:
        experiments = _api(url, "experiments/search", {"max_results": 1000}).get("experiments", [])
        if experiments:
            runs = _api(url, "runs/search", {
                "experiment_ids": [e["experiment_id"] for e in experiments],
                "filter": f"tags.`{RUN_ID_TAG}` LIKE '%'",
                "order_by": ["attributes.start_time DESC"], "max_results": 1}).get("runs", [])
            if runs:
                experiment_id = runs[0]["info"]["experiment_id"]
                tags = next((e.get("tags") or [] for e in experiments if e["experiment_id"] == experiment_id), [])
                # the reader's columns (verdict, headline metrics) where a run has set them
                view = f"&{VIEW_PARAM}" if any(t.get("key") == VIEW_TAG for t in tags) else ""
                return f"{url}/#/experiments/{experiment_id}/runs?{RUNS_VIEW}{view}"
    except (OSError, ValueError, KeyError, TypeError):
        pass  # the list is a fine page to land on; the server answered /health
    return f"{url}/#/experiments?{RUNS_VIEW}"


def start(backend_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
          log_path: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start the UI in the background and wait until it answers; returns (process, URL)."""
    backend_uri = backend_uri or default_backend_uri()
    if backend_uri.startswith("sqlite:///"):
        db = Path(backend_uri.removeprefix("sqlite:///"))
        if not db.exists():
            raise InvalidInput(f"no MLflow store at {db}: run `repro500 run` first, or set MLFLOW_TRACKING_URI")
    if port_in_use(host, port):
        raise UsageError(f"port {port} on {host} is in use; choose another with --port")
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1")
    out = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(server_command(backend_uri, host, port), stdout=out, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    url = f"http://{host}:{port}"
    try:
        wait_healthy(url, proc)
    except Stopped as stopped:
        stop(proc, stopped.signum)
        raise
    except BaseException:
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop the server and its workers (its whole process group) with *sig*, then SIGKILL."""
    for send, wait_s in ((sig, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, send)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a worker that outlived the server keeps the port otherwise


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """``repro500 ui`` was asked to stop by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into :class:`Stopped` while the block runs (once: a second
    signal while stopping is ignored, so the clean-up finishes)."""
    stopping = []

    def handler(signum: int, frame: object) -> None:
        if not stopping:
            stopping.append(signum)
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve(backend_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
          on_ready: Callable[[str], None] | None = None) -> int:
    """Run the UI until it is stopped by a signal or exits; returns the server's exit code, 0 when
    stopped.  The server's process group receives the signal that stopped ``repro500 ui``."""
    with _stop_signals():
        proc: subprocess.Popen | None = None
        try:
            proc, url = start(backend_uri, host, port)
            if on_ready is not None:
                on_ready(url)
            code = proc.wait()
            proc = None  # exited by itself
            return code
        except Stopped as stopped:
            if proc is not None:
                stop(proc, stopped.signum)
                proc = None
            return 0
        except KeyboardInterrupt:  # a SIGINT delivered before the handler was installed
            return 0
        finally:
            if proc is not None:
                stop(proc)
