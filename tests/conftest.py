"""Shared test settings: no telemetry, no network, every test in its own directory."""

from __future__ import annotations

import os
import signal

import pytest
from helpers.rundirs import GAMMA, LATENCY_S
from helpers.runs import repro500

from repro500.scaling import measure
from repro500.scaling.alphabeta import coefficients
from repro500.scaling.fit import Point

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
# repro500's helpers (the MLflow process, background hashing) step back 10 nice levels by default;
# beside the other test workers keeping every core busy they would get a tenth of a core, and a
# tracked run's test took four to six times as long. The tests of the step itself set it back.
os.environ.setdefault("REPRO500_HELPER_NICENESS", "0")

# A shell that starts the suite in the background (`nohup make test &`, some CI runners) hands it
# SIGINT ignored, and an ignored signal stays ignored across exec: the Ctrl-C an interrupt test sends
# would reach no repro500 it started.  A handled signal is reset to its default by exec, so with
# Python's own handler here every child starts as it would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# after the settings above, which are the suite's environment that each test and module starts from
pytest_plugins = ["pytester", "helpers.suite_env"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test with the working directory set to a fresh temporary directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def cosmo_data(in_tmp):
    for out, split, n in (("cosmo.h5", "train", "40"), ("cosmo-eval.h5", "eval", "8")):
        result = repro500("data", "generate", "cosmo", "--out", out, "--samples", n, "--size", "16",
                          "--seed", "2", "--split", split, cwd=in_tmp)
        assert result.returncode == 0, result.stderr
    return in_tmp / "cosmo.h5"


@pytest.fixture
def timings(tmp_path, monkeypatch):
    """A cache holding exact alpha-beta timings (L = 50 us, gamma = 1 ns/B) for this host."""
    monkeypatch.setenv("REPRO500_CACHE_DIR", str(tmp_path / "cache"))
    host, torch_version = measure.host_key()
    points = [Point(c, 2, m, sum(a * v for a, v in zip(coefficients(c, m, 2), (LATENCY_S, GAMMA), strict=True)))
              for c in ("allreduce", "allgather") for m in (4 * 4**k for k in range(13))]
    m = measure.Measurement(host, torch_version, "2026-11-22T00:00:00Z", measure.Settings(), points)
    measure.write_cache(m)
    return m
