"""Notebook 08's log step: trainer_state.json judged by run.loss, run.gradients, run.schedule and run.eval, with
the curves (anomalies marked) as the result's figure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workbench.display.result import ProbeResult
from workbench.findings import Finding, combine_findings
from workbench.probes.run.evaluation import judge_eval
from workbench.probes.run.gradients import judge_gradients
from workbench.probes.run.loss import judge_loss
from workbench.probes.run.run_facts import RunFacts, run_facts
from workbench.probes.run.run_kind import run_kind
from workbench.probes.run.schedule import judge_schedule
from workbench.probes.run.tensorboard_log import tensorboard_state
from workbench.probes.run.trainer_state import Mark, TrainingLog, read_training_log, training_log

JUDGES = (judge_loss, judge_gradients, judge_schedule, judge_eval)


@dataclasses.dataclass(repr=False)
class TrainingLogResult(ProbeResult):
    facts: RunFacts
    log: TrainingLog
    judged: list[Finding]
    marks: list[Mark]

    def findings(self) -> list[Finding]:
        return list(self.judged)

    def summary(self) -> list[list[str]]:
        log, facts = self.log, self.facts
        source = ("TensorBoard events (further than any trainer_state.json)" if facts.state_path.name.startswith(
            "events.out.tfevents") else "trainer_state.json")
        rows = [["log", f"{facts.name(facts.state_path)} ({source})"],
                 ["trainer", f"{facts.kind.name} ({facts.kind.evidence})"],
                ["steps", f"{log.global_step} of max_steps {log.max_steps}, epoch {log.state.get('epoch')}"],
                ["logged", f"{log.entries} training entries (logging_steps {log.state.get('logging_steps')}), "
                           f"{len(log.eval_step)} evaluations"],
                ["checkpoints", ", ".join(facts.name(p) for p in facts.checkpoints.values()) or "none"]]
        if facts.head is not None:
            rows.append(["head", f"{facts.head.kind}, {facts.head.classes} classes ({facts.head.source})"])
        for key in sorted(facts.configuration.values):
            rows.append([key, facts.configuration.cite(key)])
        if facts.training_args_unread is not None:
            read = (f"; its class and plain fields read from its opcodes for the {facts.kind.name} checks"
                    if facts.kind.args else "")
            rows.append(["training_args.bin", f"{facts.name(facts.training_args_unread)} not unpickled (pass "
                                              f"--allow-pickle to read it whole){read}"])
        return rows

    def details(self):
        from workbench.display.findings_view import figure
        from workbench.display.nodes import Display, Table
        from workbench.probes.run.curves import draw_curves

        alt = "loss, grad_norm and learning rate against step" + (
            "; marked: " + ", ".join(dict.fromkeys(m.label for m in self.marks)) if self.marks else "")
        return Display(figure(lambda: draw_curves(self.log, self.marks), alt) if self.log.entries else None,
                       Table(None, self.summary(), row_headers=True, left=True))


def judge_run(log: TrainingLog, facts: RunFacts, judges=JUDGES) -> tuple[list[Finding], list[Mark]]:
    """Every judge on the log, each check's findings combined into its one answer, and the marks they make."""
    findings: list[Finding] = []
    marks: list[Mark] = []
    for judge in judges:
        found, marked = judge(log, facts)
        findings += found
        marks += marked
    by_check: dict[str, list[Finding]] = {}
    for f in findings:
        by_check.setdefault(f.id, []).append(f)
    return [combine_findings(found) for found in by_check.values()], marks  # one answer per check


def training_log_probe(run_dir: Path, target) -> TrainingLogResult:
    """Read the run's longest log — its longest trainer_state.json, or its TensorBoard events when they go further
    (a run killed after its last save) — and judge it."""
    facts = run_facts(Path(run_dir), target)
    log = read_training_log(facts.state_path)
    events = tensorboard_state(facts.run_dir, log.max_steps)
    if events is not None and events[0]["global_step"] > log.global_step:  # logged past the last save
        state, files = events
        log = training_log({**log.state, **state}, source=files[-1])
        facts = dataclasses.replace(facts, state_path=files[-1])
    folders = list(dict.fromkeys([facts.folder, facts.run_dir, facts.state_path.parent]))
    facts = dataclasses.replace(facts, kind=run_kind(folders, set(log.metrics)))
    findings, marks = judge_run(log, facts)
    return TrainingLogResult(facts, log, findings, marks)
