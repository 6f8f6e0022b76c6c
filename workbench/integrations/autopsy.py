"""The run autopsy at the end of training: notebook 08's checks on the live `state.log_history` and the
checkpoints the run saved, without waiting for a `trainer_state.json` at the output_dir's root.

    run_autopsy(args, state, model, diagnosis, report_folder)   # notebook 08's part of the callback's diagnosis:
                                        # run.loss, run.gradients, run.schedule, run.eval, the preference/RL signals,
                                        # run.adapter_progress

The live state is written into the report folder (`trainer_state.json`, as `TrainerState.save_to_json` writes it)
and judged there by the same judges as `diagnose OUTPUT_DIR`; the configuration they cite is the live
TrainingArguments, every field; the head's class count comes from the live model's config and class.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

LIVE = "TrainingArguments of the live Trainer"


def live_configuration(args) -> Any:
    """Every TrainingArguments field of the live run, enums as their values, each cited as live."""
    from workbench.model.run_configuration import RunConfiguration

    values = {}
    for field in dataclasses.fields(args):
        value = getattr(args, field.name, None)
        values[field.name] = getattr(value, "value", value)
    return RunConfiguration(values, {k: LIVE for k in values})


def live_head(model):
    """The head's class count (run.loss's ln(classes)) from the live model: its config, its class as architecture."""
    from workbench.probes.run.run_facts import head_classes

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None:
        return None
    data = config.to_dict()
    data["architectures"] = data.get("architectures") or [type(base).__name__]
    return head_classes(data)


def live_training_log(run_dir: Path, state_path: Path, args, model):
    """notebook 08's `training_log` step on the state the callback saved."""
    from workbench.probes.run.log_probe import TrainingLogResult, judge_run
    from workbench.probes.run.run_facts import RunFacts, checkpoint_folders
    from workbench.probes.run.run_kind import live_run_kind
    from workbench.probes.run.trainer_state import read_training_log

    log = read_training_log(state_path)
    facts = RunFacts(run_dir, run_dir, state_path, checkpoint_folders(run_dir) if run_dir.is_dir() else {},
                     live_head(model), live_configuration(args), None, live_run_kind(args, set(log.metrics)))
    findings, marks = judge_run(log, facts)
    return TrainingLogResult(facts, log, findings, marks)


# run.versions reads the versions the run wrote into its saved files (config.json, the model card, trainer_state's
# records); at the callback the run is its own process, whose versions the report's environment lists
VERSIONS_LIVE = ("reads the versions a run recorded in its saved files against the known regressions: `workbench "
                 "diagnose OUTPUT_DIR` once the run has saved; this process' own versions are the report's environment")


def run_autopsy(args, state, model, diagnosis, folder: Path) -> str:
    """Notebook 08's steps on the live state, as a part of `diagnosis` (replacing its earlier autopsy); the part's
    name."""
    from workbench.report.diagnosis import Withheld, plan_part

    run_dir = Path(args.output_dir).resolve()
    state_path = folder / "trainer_state.json"
    state.save_to_json(str(state_path))
    part = diagnosis.add(plan_part(diagnosis.target, "08_training_run", applies=True, withheld={
        "versions": Withheld("Not run by the callback", VERSIONS_LIVE,
                             f"`workbench diagnose {run_dir} --notebooks 08` once the run has saved.")}))
    # the run_dir step's result is the live output_dir; the log is the live state, judged as `diagnose` judges one
    diagnosis.run_in_process(folder, [part], seed={"run_dir": run_dir}, replaced={
        "training_log": lambda *_inputs: live_training_log(run_dir, state_path, args, model)})
    return part.name
