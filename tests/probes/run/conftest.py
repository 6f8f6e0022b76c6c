import json
import sys
import time
from pathlib import Path

import pytest
import trl_runs
from planted_runs import PlantedRuns, build_planted_runs


@pytest.fixture(scope="session")
def planted_runs(tmp_path_factory) -> PlantedRuns:
    """Every planted run and the healthy one, trained once per session by the real Trainer (about 20 s), by the
    first worker that asks; the others read its folders."""
    import dataclasses

    from tests.shared_builds import built_once

    with built_once(tmp_path_factory, "trainer-runs") as root:
        if (root / "BUILT").exists():
            return PlantedRuns(**{field.name: root / field.name for field in dataclasses.fields(PlantedRuns)})
        runs = build_planted_runs(root)
        (root / "BUILT").write_text("every planted run trained\n")
        return runs


class Runs:
    """Builds a run the first time a test asks for it, and records its wall time."""

    def __init__(self, root: Path) -> None:
        self.root, self.built, self.seconds = root, {}, {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.built:
            start = time.perf_counter()
            self.built[name] = trl_runs.BUILDERS[name](self.root / name)
            self.seconds[name] = round(time.perf_counter() - start, 2)
        return self.built[name]


@pytest.fixture(scope="session")
def trl_runs_built(tmp_path_factory):
    """Real trl runs (trl_runs.BUILDERS), each built the first time a test asks for it, once per session."""
    built = Runs(tmp_path_factory.mktemp("trl-runs"))
    start = time.perf_counter()
    import trl  # noqa: F401  (imports and the shared warmed-up base, once, kept out of the first build's time)
    from trl import DPOTrainer, GRPOTrainer, KTOTrainer, RewardTrainer  # noqa: F401

    with trl_runs._one_thread():
        trl_runs.base_model(built.root / "base")
    built.seconds["setup (imports, warm base)"] = round(time.perf_counter() - start, 2)
    yield built
    (built.root / "build_seconds.json").write_text(json.dumps(built.seconds, indent=1))
    print(f"\ntrl run build wall times (s): {built.seconds}", file=sys.stderr)
