"""The suite's own scheduling (tests/conftest.py): a test that asks for an expensive session fixture outside its
one-worker group fails collection, naming the group, and the groups are what xdist's scheduler hands out whole."""

from types import SimpleNamespace

import pytest

from tests.conftest import ONE_WORKER_GROUPS, one_worker_group, pytest_collection_modifyitems


def test_a_test_asking_for_a_group_fixture_outside_its_group_fails_collection():
    stray = SimpleNamespace(nodeid="tests/probes/test_elsewhere.py::test_reads_the_sweep",
                            fixturenames=["tmp_path", "local_sweep"], keywords={})
    with pytest.raises(pytest.UsageError, match="needs local_sweep: add it to the 'sweep-of-three-runs' group"):
        pytest_collection_modifyitems(None, [stray])
    listed = SimpleNamespace(nodeid="tests/sweep/test_engines.py::test_new", fixturenames=["local_sweep"], keywords={})
    pytest_collection_modifyitems(None, [listed])  # inside its group: collected as it is


def test_each_group_is_one_unit_of_work_and_other_tests_their_own():
    for name, (fixtures, prefixes) in ONE_WORKER_GROUPS.items():
        assert fixtures and all(one_worker_group(prefix + "test_x") == name for prefix in prefixes)
    assert one_worker_group("tests/sweep/test_history.py::test_a_healthy_history_has_no_first_bad") is None
