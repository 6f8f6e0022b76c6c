"""One diagnosis, the path every driver takes: plan → execute → assemble → publish.

    diagnosis = Diagnosis.plan(target, ["00_saved_files", "08_training_run"])   # what runs, what is answered skip
    diagnosis.run_in_process(folder)        # execute here: each part's steps through NotebookSession + recorder
    diagnosis.record(run, sidecar_findings) # or execute elsewhere (papermill, in a kernel) and assemble its answers
    diagnosis.publish(folder)               # findings.json and index.html, through the report contract

A part is one notebook of the catalog (or of your own) in this diagnosis: the steps it runs, the steps it withholds
(their checks answered `skip` with the reason, never silently absent), or, when the notebook does not apply to the
target, its `skip` answers and nothing run (`not_applicable`: the run autopsy needs a Trainer output_dir, the memory
plan needs training arguments, the model notebooks need a model that resolves).

Every driver goes through it: `workbench diagnose` (report/runner.py: papermill executes each part's notebook in the
diagnosis' kernel and `record` reads its sidecar), the Trainer callback (integrations/preflight.py: the live steps on
the live model, one part at a time, since what notebook 04 runs depends on notebook 01's findings), the JupyterLab
panel (the ticked notebooks' steps, each result shown as it comes), the architecture census and `workbench explain
--ckpt` (only the steps that answer the checks its causes name, and the steps they read). Assembling is
`contract.notebook_answers` for every driver: one answer per declared check, an `error` for a check a notebook never
answered.

The model is shared between parts through `workbench.model.shared`, not through this object: papermill's notebooks
are separate programs in one kernel, and each prepares the model by calling the same step (`prepare_shared`), which
finds it prepared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from workbench.catalog import NotebookSpec
from workbench.catalog import Step as CatalogStep
from workbench.contract import notebook_answers
from workbench.display.result import Displayable
from workbench.findings import Finding
from workbench.report.contract import NotebookRun, Report

# the callback's withheld steps point here: what answers them in full
DIAGNOSE_A_SAVE = "Run `workbench diagnose` on a checkpoint your run saves."


@dataclasses.dataclass(frozen=True)
class Withheld:
    """Why a step of a part is not run: its checks are answered `skip` with this title, reason and fix."""

    title: str
    why: str
    fix: str = ""


@dataclasses.dataclass
class Part:
    """One notebook of a diagnosis."""

    name: str
    declared: tuple[str, ...]  # the checks it answers (the catalog's; a notebook of your own: its metadata's)
    spec: NotebookSpec | None = None  # None: a notebook of your own, executed only by papermill
    steps: tuple[CatalogStep, ...] = ()  # the steps run in process, in the notebook's order
    withheld: dict[str, Withheld] = dataclasses.field(default_factory=dict)  # step name -> why not run
    skipped: list[Finding] | None = None  # the notebook does not apply: its answers, and it is not executed
    asked: tuple[str, ...] | None = None  # the checks asked (explain): answers to others are left out
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # its parameters beyond the target's
    target: Any = None  # a target of its own (the callback's notebook 00 reads the folder the model came from)

    @property
    def runs(self) -> bool:
        return self.skipped is None

    @property
    def answers(self) -> tuple[str, ...]:
        return self.asked if self.asked is not None else self.declared


def declared_checks(notebook: Path) -> list[str]:
    """The check ids a notebook promises: the catalog's. A notebook of your own that the catalog does not know
    declares its checks in its metadata (`{"workbench": {"checks": [...]}}`)."""
    from workbench.catalog import CHECKS

    known = [c.id for c in CHECKS if c.notebook == notebook.stem]
    if known:
        return known
    meta = json.loads(notebook.read_text()).get("metadata", {})
    return list(meta.get("workbench", {}).get("checks", []))


def not_applicable(name: str, target) -> bool:
    """Whether the catalog's notebook `name` does not apply to the target: it runs only on a Trainer output_dir and
    the target is none, only with --training-args and there are none, or it needs the model and the model cannot be
    resolved. A notebook of your own always applies."""
    from workbench.catalog import NOTEBOOKS

    spec = next((nb for nb in NOTEBOOKS if nb.name == name), None)
    if spec is None:
        return False
    return bool((spec.trainer_output_only and target.run is None)
                or (spec.training_args_only and not target.training_args)
                or (target.model_unavailable and spec.needs_model))


def skipped_findings(name: str, declared: Iterable[str], target) -> list[Finding]:
    """A `skip` on each declared check of a notebook that does not apply to the target (not executed)."""
    from workbench.catalog import notebook as spec_of

    if target.model_unavailable:
        return [Finding(check, "skip", "The model cannot be resolved", f"{target.model_unavailable}. {name} "
                        "loads the model; the run autopsy (08_training_run) reads the run's own files and ran.",
                        {"notebook_run": False, "base": target.base, "checkpoint": target.checkpoint},
                        target.base_fix, name)
                for check in declared]
    if spec_of(name).training_args_only and not target.training_args:
        return [Finding(check, "skip", "no --training-args",
                        f"{name} plans the training step under the run's training arguments: pass "
                        "--training-args FILE (TrainingArguments / SFTConfig fields)", {"notebook_run": False},
                        "diagnose CKPT --training-args args.yaml, or `workbench plan CKPT` with flags.", name)
                for check in declared]
    return [Finding(check, "skip", "not a Trainer output directory",
                    f"{target.checkpoint} holds no trainer_state.json (at its root or in a checkpoint-N folder): "
                    f"{name} reads what a Trainer run left behind", {"notebook_run": False},
                    "Pass the Trainer's output_dir (or one of its checkpoint-N folders) as CKPT.", name)
            for check in declared]


def steps_answering(spec: NotebookSpec, checks: Iterable[str]) -> tuple[CatalogStep, ...]:
    """The steps of `spec` that answer `checks`, with the earlier steps they read (optional ones included), in
    notebook order."""
    names = {s.name for s in spec.steps}
    wanted: set[str] = set()
    stack = [s.name for s in spec.steps if set(checks) & set(s.reports)]
    while stack:
        name = stack.pop()
        if name in wanted:
            continue
        wanted.add(name)
        step = spec.step(name)
        stack += [ref.rstrip("?") for ref in (*step.args, *step.kwargs.values()) if ref.rstrip("?") in names]
    return tuple(s for s in spec.steps if s.name in wanted)


def plan_part(target, notebook: str | Path, *, asked: Iterable[str] | None = None,
              withheld: dict[str, Withheld] | None = None, options: dict[str, Any] | None = None,
              part_target=None, applies: bool | None = None) -> Part:
    """The part of a diagnosis that notebook `notebook` (a catalog name, or a notebook file of your own) is on
    `target`. `asked`: only the steps answering these checks (and the steps they read) run, only these checks are
    answered; `withheld`: steps not run, each with why; `applies`: the driver's own knowledge that the notebook
    applies (the callback's autopsy reads the live run, which no saved folder shows yet), else `not_applicable`."""
    from workbench.catalog import NOTEBOOKS

    path = Path(notebook)
    name = path.stem
    spec = next((nb for nb in NOTEBOOKS if nb.name == name), None)
    declared = tuple(spec.checks) if spec is not None else tuple(declared_checks(path))
    asked = None if asked is None else tuple(c for c in declared if c in set(asked))
    if not (applies if applies is not None else not not_applicable(name, part_target or target)):
        return Part(name, declared, spec, skipped=skipped_findings(name, asked or declared, part_target or target),
                    asked=asked)
    steps = () if spec is None else spec.steps if asked is None else steps_answering(spec, asked)
    return Part(name, declared, spec, steps, dict(withheld or {}), asked=asked, options=dict(options or {}),
                target=part_target)


class Diagnosis(Displayable):
    """The parts of one diagnosis of one target, and the report they assemble into."""

    def __init__(self, target, parts: Iterable[Part] = (), *, contract: dict[str, Any] | None = None,
                 created=None) -> None:
        self.target = target
        self.parts: list[Part] = list(parts)
        self.report = Report.start(contract if contract is not None else target.as_contract(), created)
        self.sessions: dict[str, Any] = {}  # part name -> the NotebookSession that ran it here
        self.shown: dict[str, list[tuple[str, Any]]] = {}  # part name -> (step label, result) as they ran
        for part in self.parts:
            self._answer_skipped(part)

    @classmethod
    def plan(cls, target, notebooks: Iterable[str | Path], *, asked: Iterable[str] | None = None, **kwargs: Any
             ) -> Diagnosis:
        """The diagnosis of `notebooks` (catalog names or notebook files) on `target`."""
        asked = None if asked is None else list(asked)
        return cls(target, [plan_part(target, nb, asked=asked) for nb in notebooks], **kwargs)

    def add(self, part: Part) -> Part:
        """A part planned once earlier parts ran (the callback's forward matrix follows notebook 01's findings)."""
        self.parts = [p for p in self.parts if p.name != part.name] + [part]
        self._answer_skipped(part)
        return part

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    @property
    def running(self) -> list[Part]:
        return [p for p in self.parts if p.runs]

    @property
    def skipped(self) -> list[Part]:
        return [p for p in self.parts if not p.runs]

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings

    # -- execute, in this process -------------------------------------------------------------------------------

    def open(self, part: Part, folder: Path, *, seed: dict[str, Any] | None = None, interactive: bool = False,
             autosave: bool = False):
        """The part's NotebookSession (its recorder writes `folder/findings.<name>.json`), its results seeded."""
        from workbench.notebook import NOTEBOOK_PARAMETERS, NotebookSession
        from workbench.recorder import FindingsRecorder

        target = part.target or self.target
        recorder = FindingsRecorder(Path(folder) / f"findings.{part.name}.json", notebook=part.name,
                                    interactive=interactive, autosave=autosave)
        session = NotebookSession(part.spec, target, recorder,
                                  {**NOTEBOOK_PARAMETERS, **target.options(), **part.options})
        session.results.update(seed or {})
        self.sessions[part.name] = session
        self.shown[part.name] = []
        return session

    def run_in_process(self, folder: Path, parts: Iterable[Part] | None = None, *,
                       seed: dict[str, Any] | None = None, live_model=None, interactive: bool = False,
                       on_step: Callable[[int, int, Part, CatalogStep, float | None], None] | None = None,
                       replaced: dict[str, Callable[..., Any]] | None = None) -> list[NotebookRun]:
        """Run `parts` (default: every part that runs) here and assemble each; returns their rows.

        Steps that load and free their own copy of the model run first, across the parts (never two copies
        resident); then the others in notebook order. A step with no input but the target and its parameters that
        answers no check (preparing the shared model) runs once and its result serves every part. Withheld steps
        are answered `skip` with their reason. `seed`: results each part starts from (the callback's live model);
        `live_model`: a model that is not ours, restored after every step that reads it; `replaced`: a step's
        function replaced by a driver's (the callback's data path reads the live Trainer);
        `on_step(i, n, part, step, seconds)` before (None) and after each step."""
        from workbench.model.guard import restored

        parts = [p for p in (self.running if parts is None else parts) if p.runs]
        sessions = {p.name: self.open(p, folder, seed=seed, interactive=interactive) for p in parts}
        seconds = {p.name: 0.0 for p in parts}
        todo: list[tuple[Part, CatalogStep]] = []
        for part in parts:
            for step in part.steps:
                why = part.withheld.get(step.name)
                if why is not None:
                    sessions[part.name].recorder.add(*(
                        Finding(c, "skip", why.title, why.why, {"step": step.name}, why.fix) for c in step.reports),
                        step=step.name)
                elif step.name not in sessions[part.name].results:  # a seeded result is not run again
                    todo.append((part, step))
        todo = run_order(todo)
        once: dict[tuple, Any] = {}
        for i, (part, step) in enumerate(todo, 1):
            session = sessions[part.name]
            if on_step is not None:
                on_step(i, len(todo), part, step, None)
            start = time.perf_counter()
            key = _shared_step_key(step)
            key = None if key is None else (id(part.target or self.target), *key)
            if key is not None and key in once:
                result = session.results[step.name] = once[key]
            else:
                guard = restored(live_model) if live_model is not None and not step.mutates and any(
                    a.rstrip("?") == "prepared" for a in step.args) else None
                function = (replaced or {}).get(step.name)
                if guard is None:
                    result = session.run(step.name, function=function)
                else:
                    with guard:
                        result = session.run(step.name, function=function)
                if key is not None:
                    once[key] = result
            took = time.perf_counter() - start
            seconds[part.name] += took
            self.shown[part.name].append((step.label, result))
            if on_step is not None:
                on_step(i, len(todo), part, step, took)
        runs = []
        for part in parts:
            session = sessions[part.name]
            session.recorder.save()
            run = NotebookRun(part.name, "ok", None, round(seconds[part.name], 2), kernel="own")
            self.record(run, session.recorder.findings, stopped="it ran every step and reported no finding for it")
            runs.append(run)
        return runs

    def view(self):
        from workbench.display.findings_view import findings_block
        from workbench.display.nodes import Display, Heading

        return Display(Heading("Findings", level=3), findings_block(self.findings))

    # -- assemble ----------------------------------------------------------------------------------------------

    def record(self, run: NotebookRun, findings: list[Finding], stopped: str | None = None) -> list[Finding]:
        """A part's answers as the report keeps them (`contract.notebook_answers`: one per declared check, an `error`
        for each it never answered, `stopped` saying why); a part run again replaces its earlier answers."""
        part = next((p for p in self.parts if p.name == run.name), None)
        declared = part.answers if part is not None else ()
        answers = notebook_answers(run.name, declared, findings, stopped or run.error or "no sidecar")
        if part is not None and part.asked is not None:
            answers = [f for f in answers if f.id in part.asked]
        self.report.add(run, answers)
        order = {p.name: i for i, p in enumerate(self.parts)}  # rows in plan order, whichever finished first
        self.report.notebooks.sort(key=lambda r: order.get(r.name, len(order)))
        return answers

    def _answer_skipped(self, part: Part) -> None:
        if not part.runs:
            self.report.findings = [f for f in self.report.findings if f.notebook != part.name] + [
                dataclasses.replace(f, notebook=part.name) for f in part.skipped]

    # -- publish -----------------------------------------------------------------------------------------------

    def publish(self, folder: Path, *, into: Path | None = None, listing: Path | None = None,
                listing_title: str | None = None, lead=None) -> Path:
        """findings.json and index.html into `folder` (secrets redacted); then `folder` renamed to `into` when given
        (a report assembled in a hidden folder appears whole), and the list of reports in `listing` rewritten.
        Returns where the report is."""
        self.report.write(folder, lead)
        if into is not None:
            os.replace(folder, into)
            folder = into
        if listing is not None:
            from workbench.report.index_page import write_reports_index

            if listing_title is None:
                write_reports_index(listing)
            else:
                write_reports_index(listing, title=listing_title)
        return folder


def run_order(steps: list[tuple[Any, CatalogStep]]) -> list[tuple[Any, CatalogStep]]:
    """(part, step) pairs in the order a diagnosis in one process runs them: the steps that load and free their own
    copy of the model first (never two copies resident), then the others, each group in notebook order."""
    return [t for t in steps if t[1].own_model] + [t for t in steps if not t[1].own_model]


def _shared_step_key(step: CatalogStep) -> tuple | None:
    """The key under which a step's result serves every part: a step reading only the target and its parameters that
    answers no check (its result is the same in every notebook: the shared model's preparation). None otherwise."""
    refs = (*step.args, *step.kwargs.values())
    if step.reports or step.mutates or step.own_model or any(
            not (r == "target" or r.startswith("params.")) for r in refs):
        return None
    return (step.probe, step.args, tuple(sorted(step.kwargs.items())))
