"""WorkbenchCallback under torchrun, 2 gloo ranks on the CPU: only process zero runs the probes and writes the
report; the other rank waits, and with raise_on="fail" both stop before the first step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import tiny_checkpoint

from workbench.distributed.launcher import launch_ranks, rank_environment

pytestmark = pytest.mark.slow  # two torchrun ranks training: not in the fast tier

HERE = Path(__file__).parent


def run_two_ranks(checkpoint: Path, out: Path, planted: str) -> dict[int, dict]:
    """The launcher the workbench's own torchrun checks use: a free loopback port, and no rank left on timeout."""
    results = out / "results"
    path = f"{HERE}:{rank_environment()['PYTHONPATH']}"
    run = launch_ranks("ddp_run", [str(checkpoint), str(out / "run"), str(results), planted], ranks=2, timeout=240,
                       out_dir=results, env={"PYTHONPATH": path})
    assert run.ok, run.output_tail[-3000:]
    return run.results


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def test_only_process_zero_writes_and_both_ranks_train(checkpoint, tmp_path):
    ranks = run_two_ranks(checkpoint, tmp_path, "healthy")
    assert sorted(ranks) == [0, 1] and {r["world"] for r in ranks.values()} == {2}
    assert [r["outcome"] for r in ranks.values()] == ["trained", "trained"]
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert ranks[0]["report"] is not None and ranks[1]["report"] is None
    reports = list((tmp_path / "run" / "workbench").glob("*/*/findings.json"))
    assert len(reports) == 1  # one report, from process zero
    found = {f["id"]: f["verdict"] for f in json.loads(reports[0].read_text())["findings"]}
    assert found["grad.flow"] == "pass" and found["run.loss"] == "pass"


def test_a_planted_defect_stops_every_rank_before_the_first_step(checkpoint, tmp_path):
    """Reentrant checkpointing under a LoRA: DDP on 2 ranks would raise at the first backward; the callback, knowing
    the run's 2 processes, fails it and stops both ranks first (in one process the same model trains: test_callback)."""
    ranks = run_two_ranks(checkpoint, tmp_path, "reentrant")
    assert all(r["outcome"].startswith("stopped: ") and "train.ddp_checkpointing FAIL" in r["outcome"]
               for r in ranks.values()), ranks
    assert ranks[0]["step"] == ranks[1]["step"] == 0 and ranks[1]["report"] is None
    assert ranks[0]["report"] in ranks[1]["outcome"]  # every rank names process zero's report
