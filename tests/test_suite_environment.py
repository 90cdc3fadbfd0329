"""The suite's own hygiene: what one test's process imports cannot reach the repro500 another test
starts (which records its environment)."""

from __future__ import annotations

import os

import pytest

LEAK = "REPRO500_TEST_LEAKED_BY_A_FIXTURE"


@pytest.fixture(scope="module")
def imports_a_library_that_sets_a_variable():
    # as threadpoolctl does with KMP_DUPLICATE_LIB_OK when a module-scoped fixture imports it
    os.environ.setdefault(LEAK, "True")
    yield


def test_a_module_fixtures_variable_does_not_reach_the_test(imports_a_library_that_sets_a_variable) -> None:
    assert LEAK not in os.environ


def test_a_tests_variable_does_not_reach_the_next_test_of_its_worker() -> None:
    os.environ[LEAK + "_2"] = "1"


def test_the_next_test_starts_from_the_suites_environment() -> None:
    assert LEAK + "_2" not in os.environ
