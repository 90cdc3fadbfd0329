"""A stand-in for an MLflow tracking server, for what a real one on a loaded machine does now and
then: answer late, fail with a server error, or not hold a run.  It speaks the few REST calls
repro500's checks make (``/health``, experiments/search, runs/get) in MLflow's own JSON, so the
client on the other side is MLflow's, unchanged.

Closed, it ends every answer still waiting and its threads with it: a handler left sleeping would
write to a socket its client closed long ago, and the traceback of that would land, minutes later,
in whatever test of this worker captures stderr then."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from typing import Any


def run_json(run_id: str, metrics: dict[str, float], tags: dict[str, str]) -> dict[str, Any]:
    """What runs/get answers for a finished run (MLflow's REST form of the Run message)."""
    info = {"run_id": run_id, "run_uuid": run_id, "experiment_id": "0", "status": "FINISHED", "start_time": 1,
            "end_time": 2, "lifecycle_stage": "active", "artifact_uri": "", "user_id": "", "run_name": run_id}
    data = {"metrics": [{"key": k, "value": v, "timestamp": 1, "step": 0} for k, v in metrics.items()],
            "params": [], "tags": [{"key": k, "value": v} for k, v in tags.items()]}
    return {"run": {"info": info, "data": data}}


class FakeTrackingServer:
    """``health_delay_s``: how long /health takes; ``run_delay_s``: how long runs/get takes;
    ``runs``: run id -> its runs/get answer (:func:`run_json`); ``run_status``: the HTTP status
    runs/get answers with (500: a server error, whatever the id)."""

    def __init__(self, *, health_delay_s: float = 0.0, run_delay_s: float = 0.0,
                 runs: dict[str, dict[str, Any]] | None = None, run_status: int = 200):
        stop, runs = threading.Event(), dict(runs or {})

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any) -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/health":
                    if not stop.wait(health_delay_s):
                        self._answer(200, "OK")
                elif url.path.endswith("/mlflow/experiments/search"):
                    self._answer(200, {"experiments": []})
                elif url.path.endswith("/mlflow/runs/get"):
                    if stop.wait(run_delay_s):
                        return  # closed before it answered
                    run_id = urllib.parse.parse_qs(url.query).get("run_id", [""])[0]
                    if run_status != 200:
                        self._answer(run_status, {"error_code": "INTERNAL_ERROR", "message": "database is locked"})
                    elif run_id in runs:
                        self._answer(200, runs[run_id])
                    else:
                        self._answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST",
                                           "message": f"Run with id={run_id} not found"})
                else:
                    self._answer(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": url.path})

            do_GET = do_POST = _route  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = False
            block_on_close = True  # server_close joins the handlers

            def handle_error(self, request, client_address):
                pass  # a client that gave up is what a test makes happen

        self.stop = stop
        self.server = Server(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def __enter__(self) -> FakeTrackingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
