"""Running probes: a probe that crashes becomes an `error` finding and the notebook goes on.

    rec = FindingsRecorder("findings.01.json", notebook="01_dtype_distribution")
    census = rec.run(loaded_census_probe, prepared, target, checks=("dtype.census",))   # shown; findings recorded

The caller says which checks the probe answers (a notebook step's `reports`, from the catalog). If the probe
raises, each of them gets an `error` finding with the traceback and `run` returns a `Failed` that displays the
error and keeps the exception; in interactive use it is also left where `%debug` looks (`sys.last_exc` /
`sys.last_traceback`). A probe handed a `Failed` is not called, and its checks get an `error` naming the step and
the checks it depended on. A probe that raises `NotApplicable` (a set-up for another kind of model) gives its checks,
and those of every step that needs it, a `skip` with its reason instead. In the catalog's notebooks and the panel, a
finding whose id neither the catalog nor the caller declares is refused. The sidecar is rewritten after every probe,
so a kernel that dies still leaves what was found.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from workbench.catalog import CHECK_IDS, NOTEBOOKS
from workbench.display.result import Displayable
from workbench.errors import NotApplicable
from workbench.findings import Finding, sort_findings, write_json_atomic


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
    def __init__(self, path: str | Path, notebook: str, *, interactive: bool = False, autosave: bool = True) -> None:
        self.path = Path(path)
        self.notebook = notebook
        self.interactive = interactive
        self.autosave = autosave
        self.findings: list[Finding] = []
        self.declared: set[str] = set()  # check ids callers named beyond the catalog's
        # the catalog's notebooks and the panel report only declared ids; a notebook of your own declares its ids in
        # its metadata, which the runner reads (report.runner.declared_checks)
        self.validates_ids = notebook == "panel" or notebook in {nb.name for nb in NOTEBOOKS}
        self.cost: dict[str, Any] = {}  # what the notebook cost (loads, memory), written beside the findings
        self._changed()

    def add(self, *findings: Finding) -> None:
        undeclared = sorted({f.id for f in findings} - CHECK_IDS - self.declared)
        if undeclared and self.validates_ids:
            raise ValueError(f"finding ids {undeclared} are not declared in workbench.catalog (nor by the caller's "
                             "checks=): add a Check, or name the id in the step's reports")
        for f in findings:
            f = dataclasses.replace(f, notebook=self.notebook)  # a copy: the result's own findings stay as they are
            self.findings = [g for g in self.findings if g.id != f.id or g.verdict == "error"] + [f]
        self._changed()

    def set_cost(self, cost: dict[str, Any]) -> None:
        self.cost = cost
        self._changed()

    def run(self, func: Callable[..., Any], *args: Any, checks: tuple[str, ...] = (), step: str | None = None,
            **kwargs: Any) -> Any:
        """Call `func(*args, **kwargs)` as the step `step` (default: the function's name) answering `checks`."""
        step = step or getattr(func, "__name__", str(func))
        checks = tuple(checks)
        self.declared.update(checks)
        failed_inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, Failed)]
        if failed_inputs:
            dep = next((f for f in failed_inputs if not f.skipped), failed_inputs[0])
            if dep.skipped:  # a check an earlier step already answered (03's attribute chain) keeps its answer
                answered = {f.id for f in self.findings}
                self.add(*(Finding(c, "skip", dep.exception.title if isinstance(dep.exception, NotApplicable)
                                   else f"{c} does not apply", dep.message, {"depends_on": dep.step})
                           for c in checks if c not in answered))
                return Failed(step, dep.message, exception=dep.exception, checks=checks, skipped=True)
            msg = f"depends on step {dep.named}, which could not run ({dep.message})"
            self.add(*(Finding(c, "error", f"{c} could not run", msg,
                               {"depends_on": dep.step, "depends_on_checks": list(dep.checks)},
                               "Fix the step it depends on.") for c in checks))
            return Failed(step, msg, checks=checks)
        try:
            result = func(*args, **kwargs)
        except NotApplicable as exc:
            self.add(*(Finding(c, "skip", exc.title, str(exc), {"step": step}) for c in checks))
            return Failed(step, str(exc), exception=exc, checks=checks, skipped=True)
        except Exception as exc:  # noqa: BLE001 - a crashing probe is an error finding, not a dead notebook
            self.add(*(Finding.from_exception(c, exc) for c in checks))
            if self.interactive:  # where IPython's %debug and %tb look for the last exception
                sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
                sys.last_exc = exc
            return Failed(step, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))[-6000:],
                          exception=exc, checks=checks)
        findings = result.findings() if hasattr(result, "findings") else []
        self.add(*findings)
        return result

    def _changed(self) -> None:
        if self.autosave:
            self.save()

    def save(self) -> None:
        """Rewrite the sidecar (after every probe unless `autosave=False`: a kernel that dies still leaves what was
        found)."""
        write_json_atomic(self.path, {"notebook": self.notebook, "cost": self.cost,
                                      "findings": [f.to_dict() for f in sort_findings(self.findings)]})

    def view(self):
        from workbench.display.findings_view import findings_block
        from workbench.display.nodes import Display, Heading

        return Display(Heading(f"Findings · {self.notebook}", level=3), findings_block(self.findings))
