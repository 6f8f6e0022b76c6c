import pytest
from planted_runs import PlantedRuns, build_planted_runs


@pytest.fixture(scope="session")
def planted_runs(tmp_path_factory) -> PlantedRuns:
    """Every planted run and the healthy one, trained once per session by the real Trainer (about 20 s)."""
    return build_planted_runs(tmp_path_factory.mktemp("trainer-runs"))
