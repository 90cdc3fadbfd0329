"""`repro500 ui` in a real browser: the address it prints opens the runs table of a tracked run,
not MLflow's GenAI overview (traces, token usage), rendered by headless Chromium."""

from __future__ import annotations

import contextlib
import html
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.ports import free_port
from helpers.runs import write_recipe

from repro500.runner import RunOptions, run
from repro500.tracking import ui

READY_S = 180  # the tiny run's store, MLflow's server start and /health on a loaded 2-core machine
BROWSER_S = 120


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    # CI installs Debian's chromium and sets REPRO500_REQUIRE_CHROMIUM=1: there, a missing browser
    # fails this test instead of letting the UI's landing page go unchecked unnoticed
    if os.environ.get("REPRO500_REQUIRE_CHROMIUM") == "1":
        pytest.fail("REPRO500_REQUIRE_CHROMIUM=1 but no chromium binary is on PATH")
    pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium)")


def _page_text(binary: str, profile: Path, url: str) -> str:
    """The text Chromium shows at *url* once MLflow's single-page app has rendered."""
    # wide: the runs table renders only the columns that fit its window
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--window-size=3000,1200",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}",
             # the app renders from its API's answers; 20 s of page time lets every fetch land
             "--virtual-time-budget=20000", "--dump-dom", url]
    proc = subprocess.run([binary, *flags], capture_output=True, text=True, timeout=BROWSER_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", proc.stdout, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))


def _ready_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The UI's "MLflow UI: ..." line (printed once MLflow answers), else all it said before it
    exited or the time ran out (a warning may come first: stderr is in the same pipe)."""
    said: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("MLflow UI: "):
                return line
            said.append(line)
            if line:
                continue
        if proc.poll() is not None:
            break
    return "".join(said)


# in make test, as the report's browser test is: a tracked run, MLflow's server and a browser, about
# 30 s on 2 cores
@pytest.mark.slow
def test_the_printed_address_renders_the_runs_table_in_chromium(in_tmp, monkeypatch):
    from mlflow.tracking import MlflowClient

    from repro500.tracking.names import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, RUN_ID_TAG

    binary = _chromium()
    uri = f"sqlite:///{in_tmp / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.time()
    # two repeats: a band needs two for its confidence bound, the column the reader looks for
    run(RunOptions(recipe=str(write_recipe(in_tmp / "tiny.yaml", repeats=2, fixed__epochs=1))))
    wall_s = time.time() - started
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("repro500/tiny")
    assert experiment.tags.get(EXPERIMENT_KIND_TAG) == EXPERIMENT_KIND
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`mlflow.parentRunId` IS NULL")
    run_name = parent.info.run_name
    assert run_name == parent.data.tags[RUN_ID_TAG]
    duration_s = (parent.info.end_time - parent.info.start_time) / 1000  # the UI's Duration column
    assert abs(duration_s - wall_s) <= 0.1 * wall_s, (duration_s, wall_s)
    verdict = parent.data.tags["verdict"]

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "repro500.cli", "ui", "--port", str(port)], cwd=in_tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = _ready_line(proc, READY_S)
        page = (f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
                "&viewStateShareKey=repro500")
        assert page in line, line
        text = _page_text(binary, in_tmp / "chrome-profile", page)
        # the runs table, holding the run: not the empty GenAI overview a bare address opens on
        assert "Run Name" in text and run_name in text, text[:3000]
        assert "Token Usage" not in text and "Traces 0" not in text, text[:3000]
        # and, with no column picked, what a reader wants first: the verdict, the headline metric,
        # its bound and margin, beside the run's duration
        header = text[text.index("Run Name"):text.index(run_name)]
        for column in ("Duration", "verdict", "accuracy_mean", "accuracy_band_bound", "accuracy_band_margin"):
            assert re.search(rf"(^| ){column}( |$)", header), (column, header)
        assert f" {verdict} " in text[text.index(run_name):], text[:3000]
    finally:
        proc.send_signal(signal.SIGINT)  # repro500 ui passes it to MLflow's whole process group
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a wedged UI: take its server's process group down too
            servers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            for pid in servers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(pid), signal.SIGKILL)
            proc.kill()
            proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while ui.port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ui.port_in_use("127.0.0.1", port)  # the server and its workers are gone
