"""A Trainer output directory as CKPT: which save is diagnosed, --checkpoint N, a checkpoint-N given directly."""

import pytest

from workbench.cli import main
from workbench.errors import UsageError
from workbench.model.target import resolve_target


def test_the_final_save_is_diagnosed_when_there_is_one(planted_runs):
    target = resolve_target(str(planted_runs.healthy))
    assert target.model_dir == planted_runs.healthy.resolve() and target.run.step is None
    assert target.as_contract()["run"].startswith("the final save at the root")
    assert resolve_target(**target.options()).run == target.run


def test_the_latest_checkpoint_without_a_final_save(planted_runs):
    target = resolve_target(str(planted_runs.no_final_save))
    assert target.model_dir.name == "checkpoint-20" and target.run.checkpoints == (10, 20)
    assert "the latest checkpoint; no final save" in target.as_contract()["run"]
    assert resolve_target(**target.options()).run == target.run


def test_checkpoint_n_picks_another_and_a_checkpoint_folder_works_directly(planted_runs):
    picked = resolve_target(str(planted_runs.healthy), run_checkpoint=10)
    direct = resolve_target(str(planted_runs.healthy / "checkpoint-10"))
    assert picked.model_dir.name == direct.model_dir.name == "checkpoint-10"
    assert picked.run == direct.run and picked.run.run_dir == planted_runs.healthy.resolve()
    assert resolve_target(**picked.options()).run == picked.run


def test_a_missing_checkpoint_is_one_line_and_exit_2(planted_runs, capsys):
    with pytest.raises(UsageError, match="no checkpoint-7 folder .checkpoints present: 10, 20, 30"):
        resolve_target(str(planted_runs.healthy), run_checkpoint=7)
    assert main(["diagnose", str(planted_runs.healthy), "--checkpoint", "7", "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint-7" in err


def test_a_plain_checkpoint_is_no_run(planted_runs, tmp_path):
    import shutil

    shutil.copytree(planted_runs.healthy / "checkpoint-10", tmp_path / "model", ignore=shutil.ignore_patterns("trainer_state.json"))
    assert resolve_target(str(tmp_path / "model")).run is None
    with pytest.raises(UsageError, match="not a Trainer output directory"):
        resolve_target(str(tmp_path / "model"), run_checkpoint=10)


def test_notebook_08_is_skipped_without_running_on_a_checkpoint_that_is_no_run(planted_runs, tmp_path):
    import shutil

    from workbench.catalog import notebook
    from workbench.paths import NOTEBOOK_DIR
    from workbench.report.diagnosis import Diagnosis
    from workbench.report.runner import find_notebooks

    shutil.copytree(planted_runs.healthy / "checkpoint-10", tmp_path / "model", ignore=shutil.ignore_patterns("trainer_state.json"))
    plain, run = resolve_target(str(tmp_path / "model")), resolve_target(str(planted_runs.healthy))
    notebooks = find_notebooks(NOTEBOOK_DIR)
    on_plain, on_run = Diagnosis.plan(plain, notebooks), Diagnosis.plan(run, notebooks)
    # neither has --training-args: notebook 11 (the memory plan) is not executed either
    assert [p.name for p in on_plain.skipped] == ["08_training_run", "11_memory_plan"]
    assert [p.name for p in on_run.skipped] == ["11_memory_plan"]
    planned = on_plain.part("11_memory_plan").skipped
    assert [(f.id, f.verdict, f.title) for f in planned] == [("plan.memory", "skip", "no --training-args")]
    skipped = on_plain.part("08_training_run").skipped
    # the plan's skips are the report's answers for those notebooks, before anything runs
    assert {(f.id, f.notebook) for f in on_plain.findings} == {(f.id, f.notebook) for f in [*planned, *skipped]}
    assert {f.id for f in skipped} == set(notebook("08_training_run").checks) and {f.verdict for f in skipped} == {"skip"}
