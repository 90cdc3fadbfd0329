"""Shared test settings: no telemetry, no network, every test in its own directory."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test with the working directory set to a fresh temporary directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
