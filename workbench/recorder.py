"""Running probes: a probe that crashes becomes an `error` finding and the notebook goes on.

    rec = FindingsRecorder("findings.01.json", notebook="01_dtype_distribution")
    census = rec.run(loaded_census_probe, prepared, target)   # shown by the cell; findings recorded

Which checks a probe answers comes from the catalog (`workbench.catalog`). If the probe raises, each of its
checks gets an `error` finding with the traceback and `run` returns a `Failed` that displays the error and keeps
the exception; in interactive use it is also left where `%debug` looks (`sys.last_exc` / `sys.last_traceback`).
A probe handed a `Failed` is not called, and its checks get an `error` naming the step it depended on. The
sidecar is rewritten after every probe, so a kernel that dies still leaves what was found.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from workbench.catalog import checks_reported_by
from workbench.findings import Finding, sort_findings, write_json_atomic
from workbench.report.text import TextRepr


@dataclasses.dataclass(repr=False)
class Failed(TextRepr):
    """What a probe returned when it crashed or could not run."""

    step: str
    message: str
    traceback: str = ""
    exception: BaseException | None = dataclasses.field(default=None, repr=False, compare=False)

    def __bool__(self) -> bool:
        return False

    def display(self):
        from workbench.report.display import Bold, Box, Code, Details, Display, Inline, Pre

        debug = self.exception is not None
        hint = Inline(" · ", Code("%debug"), " opens the debugger at the failure") if debug else None
        return Display(Box("#7b1fa2", "#f3e5f5", Inline(Bold(f"{self.step} could not run"), f": {self.message}", hint),
                           Details("traceback", Pre(self.traceback)) if self.traceback else None))

    def reraise(self) -> None:
        """Raise the original exception again (with its traceback), e.g. to step into it."""
        if self.exception is None:
            raise RuntimeError(repr(self))
        raise self.exception


class FindingsRecorder(TextRepr):
    def __init__(self, path: str | Path, notebook: str, *, interactive: bool = False) -> None:
        self.path = Path(path)
        self.notebook = notebook
        self.interactive = interactive
        self.findings: list[Finding] = []
        self.cost: dict[str, Any] = {}  # what the notebook cost (loads, memory), written beside the findings
        self.save()

    def add(self, *findings: Finding) -> None:
        for f in findings:
            f.notebook = self.notebook
            self.findings = [g for g in self.findings if g.id != f.id or g.verdict == "error"] + [f]
        self.save()

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        step = getattr(func, "__name__", str(func))
        checks = checks_reported_by(func)
        failed_inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, Failed)]
        if failed_inputs:
            dep = failed_inputs[0]
            msg = f"depends on {dep.step}, which could not run ({dep.message})"
            self.add(*(Finding(c, "error", f"{c} could not run", msg,
                               {"depends_on": dep.step}, "Fix the step it depends on.") for c in checks))
            return Failed(step, msg)
        try:
            result = func(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a crashing probe is an error finding, not a dead notebook
            self.add(*(Finding.from_exception(c, exc) for c in checks))
            if self.interactive:  # where IPython's %debug and %tb look for the last exception
                sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
                sys.last_exc = exc
            return Failed(step, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))[-6000:],
                          exception=exc)
        findings = result.findings() if hasattr(result, "findings") else []
        self.add(*findings)
        return result

    def save(self) -> None:
        """Rewrite the sidecar (after every probe: a kernel that dies still leaves what was found)."""
        write_json_atomic(self.path, {"notebook": self.notebook, "cost": self.cost,
                                      "findings": [f.to_dict() for f in sort_findings(self.findings)]})

    def display(self):
        from workbench.report.display import Display, Heading
        from workbench.report.html import findings_block

        return Display(Heading(f"Findings · {self.notebook}", level=3), findings_block(self.findings))
