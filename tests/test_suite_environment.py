"""The suite's own hygiene (tests/helpers/suite_env.py): what a library imported in the test
process sets cannot reach the repro500 a later test starts, which records its environment."""

from __future__ import annotations

from pathlib import Path

LEAKS = '''
import os
import pytest

@pytest.fixture(scope="module")
def imports_a_library():
    os.environ.setdefault("LEAKED_BY_A_MODULE_FIXTURE", "True")  # as threadpoolctl does with KMP_DUPLICATE_LIB_OK
    yield

@pytest.fixture(scope="module")
def sets_one_for_its_tests():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SET_FOR_THE_MODULE", "1")
        yield

os.environ["LEAKED_AT_COLLECTION"] = "1"

def test_a(imports_a_library, sets_one_for_its_tests):
    os.environ["LEAKED_BY_A_TEST"] = "1"
    assert os.environ["SET_FOR_THE_MODULE"] == "1" and "LEAKED_AT_COLLECTION" not in os.environ

def test_b(imports_a_library, sets_one_for_its_tests):
    assert os.environ["SET_FOR_THE_MODULE"] == "1" and os.environ["LEAKED_BY_A_MODULE_FIXTURE"] == "True"
    assert "LEAKED_BY_A_TEST" not in os.environ
'''
LATER = '''
import os

def test_c():
    assert not {"LEAKED_BY_A_MODULE_FIXTURE", "SET_FOR_THE_MODULE", "LEAKED_BY_A_TEST"} & set(os.environ)
'''


def test_a_variable_set_by_a_test_a_module_or_collection_does_not_reach_the_next(pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the plugin is tests/helpers/suite_env.py
    pytester.makepyfile(test_1_leaks=LEAKS, test_2_later=LATER)
    result = pytester.runpytest_subprocess("-p", "helpers.suite_env", "-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_without_the_plugin_the_next_module_sees_the_leaks(pytester) -> None:
    pytester.makepyfile(test_1_leaks=LEAKS.replace(' and "LEAKED_AT_COLLECTION" not in os.environ', ""),
                        test_2_later=LATER)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)  # the control: these leaks are real without it
