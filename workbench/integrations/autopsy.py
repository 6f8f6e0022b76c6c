"""The run autopsy at the end of training: notebook 08's checks on the live `state.log_history` and the
checkpoints the run saved, without waiting for a `trainer_state.json` at the output_dir's root.

    run = run_autopsy(args, state, model, report_folder)   # a NotebookRun: run.loss, run.gradients, run.schedule,
                                                           # run.eval, the preference/RL signals, run.adapter_progress

The live state is written into the report folder (`trainer_state.json`, as `TrainerState.save_to_json` writes it)
and judged there by the same judges as `diagnose OUTPUT_DIR`; the configuration they cite is the live
TrainingArguments, every field; the head's class count comes from the live model's config and class.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from workbench.catalog import notebook
from workbench.integrations.preflight import NotebookRun

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


def run_autopsy(args, state, model, folder: Path) -> NotebookRun:
    from workbench.probes.run.adapter_progress import adapter_progress_probe
    from workbench.probes.run.trl_signals import run_signals_probe
    from workbench.recorder import Failed, FindingsRecorder

    start = time.perf_counter()
    spec = notebook("08_training_run")
    run_dir = Path(args.output_dir).resolve()
    state_path = folder / "trainer_state.json"
    state.save_to_json(str(state_path))
    recorder = FindingsRecorder(folder / f"findings.{spec.name}.json", notebook=spec.name, autosave=False)
    shown = []
    log_step, signals_step = spec.step("training_log"), spec.step("run_signals")
    progress_step = spec.step("adapter_progress")
    log = recorder.run(live_training_log, run_dir, state_path, args, model, checks=log_step.reports,
                       step=log_step.name)
    shown.append((log_step.label, log))
    signals = recorder.run(run_signals_probe, log, checks=signals_step.reports, step=signals_step.name)
    shown.append((signals_step.label, signals))
    optional = None if isinstance(signals, Failed) else signals  # the catalog's "run_signals?"
    shown.append((progress_step.label, recorder.run(adapter_progress_probe, run_dir, signals=optional,
                                                    checks=progress_step.reports, step=progress_step.name)))
    recorder.save()
    return NotebookRun(spec.name, recorder, shown, time.perf_counter() - start)
