"""Running probes: a probe that crashes becomes an `error` finding and the notebook goes on.

    rec = FindingsRecorder("findings.01.json", notebook="01_dtype_distribution")
    census = rec.run(loaded_census_probe, prepared, target, checks=("dtype.census",))   # shown; findings recorded

The caller says which checks the probe answers (a notebook step's `reports`, from the catalog; a step that declares
none answers none: its result is shown, its findings are a later step's to answer). If the probe
raises, each of them gets an `error` finding with the traceback and `run` returns a `Failed` that displays the
error and keeps the exception; in interactive use it is also left where `%debug` looks (`sys.last_exc` /
`sys.last_traceback`). A probe handed a `Failed` is not called, and its checks get an `error` naming the step and
the checks it depended on. A probe that raises `NotApplicable` (a set-up for another kind of model) gives its checks,
and those of every step that needs it, a `skip` with its reason instead.

Every answer goes through the check contract (`workbench.contract`): a step answers each check it declares exactly
once, with a verdict the check declares, and no other step of the notebook answers it too. A broken answer raises
`ContractViolation` in strict mode (the test suite) and otherwise becomes an `error` on that check naming the step,
with what the probe said in its evidence. Running a step again (a cell re-run) replaces that step's answers. The
sidecar is rewritten after every probe unless `autosave=False` (the callback saves once per notebook), so a kernel
that dies still leaves what was found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from workbench import contract
from workbench.catalog import NOTEBOOKS
from workbench.display.result import Displayable
from workbench.errors import NotApplicable
from workbench.findings import Finding, sort_findings, write_json_atomic
from workbench.model.passes import counted_passes
from workbench.peak_memory import step_peak_rss


@dataclasses.dataclass(repr=False)
class Failed(Displayable):
    """What a probe returned when it crashed or could not run: the step, the checks it reports, why."""

    step: str
    message: str
    traceback: str = ""
    exception: BaseException | None = dataclasses.field(default=None, repr=False, compare=False)
    checks: tuple[str, ...] = ()
    skipped: bool = False  # it does not apply (NotApplicable): its checks and its dependents' say skip

    @property
    def named(self) -> str:
        """The step and its checks, as messages name them: "grads (grad.flow)"."""
        return f"{self.step} ({', '.join(self.checks)})" if self.checks else self.step

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<Failed {self.named}: {self.message[:120]}>"

    def view(self):
        from workbench.display.nodes import Bold, Box, Code, Details, Display, Inline, Pre

        if self.skipped:
            return Display(Box("#616161", "#f5f5f5", Inline(Bold(f"{self.named} does not apply"), f": {self.message}")))
        debug = self.exception is not None
        hint = Inline(" · ", Code("%debug"), " opens the debugger at the failure") if debug else None
        return Display(Box("#7b1fa2", "#f3e5f5", Inline(Bold(f"{self.named} could not run"), f": {self.message}", hint),
                           Details("traceback", Pre(self.traceback)) if self.traceback else None))

    def reraise(self) -> None:
        """Raise the original exception again (with its traceback), e.g. to step into it."""
        if self.exception is None:
            raise RuntimeError(str(self))
        raise self.exception


class FindingsRecorder(Displayable):
    def __init__(self, path: str | Path, notebook: str, *, interactive: bool = False, autosave: bool = True,
                 step_peaks: bool = False) -> None:
        self.path = Path(path)
        self.notebook = notebook
        self.interactive = interactive
        self.autosave = autosave
        # each step's peak memory, read by restarting the process' count (`peak_memory.step_peak_rss`): only in a
        # process of the diagnosis' own (its kernel), never in a training process (the callback) or your session,
        # whose own peak it would change
        self.step_peaks = step_peaks
        self.answers: dict[str, tuple[str, Finding]] = {}  # check id -> (the step that answered it, its answer)
        self.declared: set[str] = set()  # check ids callers named beyond the catalog's
        # the catalog's notebooks report only declared ids; a notebook of your own declares its ids in its metadata,
        # which the diagnosis reads (report.diagnosis.declared_checks)
        self.validates_ids = notebook in {nb.name for nb in NOTEBOOKS}
        self.cost: dict[str, Any] = {}  # what the notebook cost (loads, memory), written beside the findings
        self.step_seconds: dict[str, dict[str, Any]] = {}  # step -> its checks and seconds, in the order they ran
        self.environment: dict[str, Any] | None = None  # the software the notebook ran with, read on first save
        self._changed()

    @property
    def findings(self) -> list[Finding]:
        return [finding for _, finding in self.answers.values()]

    def add(self, *findings: Finding, step: str = "added by the caller") -> None:
        """Record answers that no step ran for (a driver's skips): the same contract as a step's answers."""
        self._record(step, None, list(findings))

    def _record(self, step: str, declared: tuple[str, ...] | None, findings: list[Finding]) -> None:
        answered = {check_id: by for check_id, (by, _) in self.answers.items() if by != step}
        known = self.declared if self.validates_ids else {f.id for f in findings}
        problems = contract.contract_problems(step, declared, findings, answered, known)
        contract.enforce(step, problems)
        kept = [f for f in findings if f.id not in problems]
        kept += [contract.broken_contract_finding(check_id, step, why, findings) for check_id, why in problems.items()]
        for f in kept:
            # a copy: the result's own findings stay as they are
            self.answers[f.id] = (step, dataclasses.replace(f, notebook=self.notebook))
        contract.log_verdicts(kept)
        self._changed()

    def set_cost(self, cost: dict[str, Any]) -> None:
        self.cost = cost
        self._changed()

    def run(self, func: Callable[..., Any], *args: Any, checks: tuple[str, ...] | None = None,
            step: str | None = None, **kwargs: Any) -> Any:
        """Call `func(*args, **kwargs)` as the step `step` (default: the function's name) answering `checks`."""
        step = step or getattr(func, "__name__", str(func))
        # checks=None (interactive use): the result's findings are held to the catalog alone; a tuple: the step's
        # declared checks, the only ones it answers (a catalog step declaring none, such as 03's attribute chain,
        # shows an intermediate result whose findings a later step answers)
        declared = None if checks is None else tuple(checks)
        checks = declared or ()
        self.declared.update(checks)
        failed_inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, Failed)]
        if failed_inputs:
            dep = next((f for f in failed_inputs if not f.skipped), failed_inputs[0])
            if dep.skipped:
                self._record(step, declared, [
                    Finding(c, "skip", dep.exception.title if isinstance(dep.exception, NotApplicable)
                            else f"{c} does not apply", dep.message, {"depends_on": dep.step}) for c in checks])
                return Failed(step, dep.message, exception=dep.exception, checks=checks, skipped=True)
            msg = f"depends on step {dep.named}, which could not run ({dep.message})"
            self._record(step, declared, [
                Finding(c, "error", f"{c} could not run", msg,
                        {"depends_on": dep.step, "depends_on_checks": list(dep.checks)}, "Fix the step it depends on.")
                for c in checks])
            return Failed(step, msg, checks=checks)
        entry, passes = None, None
        try:
            with counted_passes() as passes, \
                    (step_peak_rss() if self.step_peaks else contextlib.nullcontext([None])) as peak:
                started = time.perf_counter()
                try:
                    result = self._call(func, args, kwargs, step, declared, checks)
                finally:  # the step's own time, the probe and the judgment of its result (a re-run replaces it)
                    entry = self.step_seconds[step] = {"step": step, "checks": list(checks),
                                                       "seconds": round(time.perf_counter() - started, 3)}
        finally:  # its full-model forwards, read once the block has ended: as it ends, `counted_passes` drops the
            # part of a model run beside the whole (a VLM's vision tower counting image tokens)
            if entry is not None:
                entry.update(forwards=passes.forwards, forwards_with_grad=passes.with_grad)
        if peak[0] is not None:  # read as the block ends
            self.step_seconds[step]["peak_rss_bytes"] = peak[0]
        return result

    def _call(self, func: Callable[..., Any], args: tuple, kwargs: dict[str, Any], step: str,
              declared: tuple[str, ...] | None, checks: tuple[str, ...]) -> Any:
        try:
            result = func(*args, **kwargs)
        except NotApplicable as exc:
            self._record(step, declared, [Finding(c, "skip", exc.title, str(exc), {"step": step}) for c in checks])
            return Failed(step, str(exc), exception=exc, checks=checks, skipped=True)
        except contract.ContractViolation:
            raise  # strict mode: a probe's own result broke the contract
        except Exception as exc:  # noqa: BLE001 - a crashing probe is an error finding, not a dead notebook
            self._record(step, declared, [Finding.from_exception(c, exc) for c in checks])
            if self.interactive:  # where IPython's %debug and %tb look for the last exception
                sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
                sys.last_exc = exc
            return Failed(step, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))[-6000:],
                          exception=exc, checks=checks)
        try:
            findings = result.findings() if hasattr(result, "findings") else []
        except contract.ContractViolation:
            raise
        except Exception as exc:  # noqa: BLE001 - a result that cannot judge its evidence: an error, as a crash is
            self._record(step, declared, [Finding.from_exception(c, exc) for c in checks])
            return Failed(step, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))[-6000:],
                          exception=exc, checks=checks)
        if declared is None and findings:
            self._record(step, None, list(findings))
        elif declared:
            self._record(step, declared, list(findings))
        return result

    def _changed(self) -> None:
        if self.autosave:
            self.save()

    def save(self) -> None:
        """Rewrite the sidecar (after every probe unless `autosave=False`: a kernel that dies still leaves what was
        found)."""
        if self.environment is None:
            from workbench.environment import environment_facts

            self.environment = environment_facts()  # the kernel's: the report runner's process imports no torch
        write_json_atomic(self.path, {"notebook": self.notebook, "cost": self.cost, "environment": self.environment,
                                      "steps": list(self.step_seconds.values()),
                                      "findings": [f.to_dict() for f in sort_findings(self.findings)]})

    def view(self):
        from workbench.display.findings_view import findings_block
        from workbench.display.nodes import Display, Heading

        return Display(Heading(f"Findings · {self.notebook}", level=3), findings_block(self.findings))
