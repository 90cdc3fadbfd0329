"""Fixtures several test modules share.

A module that wants one binds it to a name of its own (``native = fixtures.native``): pytest finds
a fixture where it is bound, so it serves that module only, and an autouse one stays autouse there
and nowhere else.  (Imported by its own name, a fixture reads to linters as an unused import that
each test's parameter redefines.)
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def native():
    """The compiled CPU operators (compiled once per machine into the repro500 cache).  A build that
    fails fails the test with the compiler's reason: a missing operator is a bug, not a skip."""
    import torch  # only the modules that use the operators pay for torch here

    from repro500.ext import ops

    if not ops.load_native():
        pytest.fail(f"the C++ operators did not build: {ops.native_error()}")
    return torch.ops.repro500


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """repro500's cache (data digests, data files) in the test's own directory, so no test reads
    what another left there."""
    monkeypatch.setenv("REPRO500_CACHE_DIR", str(tmp_path / "cache"))
