"""``repro500 ui``: MLflow's own UI on the tracking store repro500 logs to, on loopback.

The UI is MLflow's (``mlflow server``); repro500 only points it at the right store, binds it
to 127.0.0.1 by default (a team server is documented in docs/team.md) and waits until it
answers before printing the URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from repro500.errors import InvalidInput, UsageError

HEALTH_TIMEOUT_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    except BaseException:
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and its workers (it runs in its own process group)."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
