"""A pytest plugin: what a library imported in the test process sets in ``os.environ`` stays with
the test, or the module, that imported it.

threadpoolctl sets KMP_DUPLICATE_LIB_OK when imported, and libraries like it set variables for
themselves.  A later test on the same worker would hand them to the repro500 it starts, which
records its environment: the test would see what ran before it, and which tests ran before it
differs from run to run (xdist's distribution).  So each test's environment is put back after it,
a module's after its last test (once its module-scoped fixtures are torn down: a fixture of the
module may set variables for its tests, with ``pytest.MonkeyPatch.context()``), and what collection
imported is dropped before the first test.
"""

from __future__ import annotations

import os

import pytest

# pytest's own, set and removed around each phase of a test
OWN = "PYTEST_CURRENT_TEST"


def _snapshot() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != OWN}


def _restore(saved: dict[str, str]) -> None:
    for name in set(os.environ) - set(saved) - {OWN}:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


SUITE_ENV = _snapshot()  # as the conftest that registers this plugin leaves it


def pytest_collection_finish(session: pytest.Session) -> None:
    _restore(SUITE_ENV)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.module is not getattr(item, "module", None):
            _restore(SUITE_ENV)


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    saved = _snapshot()
    yield
    _restore(saved)
