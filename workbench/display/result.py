"""The two bases every shown object derives from: evidence, verdicts and rendering kept apart.

`Displayable` is anything a notebook shows (a target, a set-up, a failed step): it supplies `view()`, a `Display`,
and gets both of its views from that one render (rich's pattern).

`ProbeResult` is what a probe returns. Adding a check means writing one:

    @dataclasses.dataclass(repr=False)       # repr=False: the dataclass repr would replace the short one
    class GradFlowResult(ProbeResult):
        rows: list[GradRow]                  # the evidence, as fields
        ...
        def findings(self) -> list[Finding]: # the verdicts: computed once per result (the base caches them)
            ...
        def details(self):                   # the result's own blocks, shown below its findings table
            return Display(Table.from_records(...))

and nothing else: the base renders the findings table, then the details; `_repr_mimebundle_` gives Jupyter HTML and
text from one render; `str()` / `print()` is the text view; `repr()` stays short (`<GradFlowResult grad.flow:
pass>`) so debuggers and variable inspectors stay usable. A result must not change after its findings are read.
"""

from __future__ import annotations

import functools
from typing import Any

from workbench import contract
from workbench.display.findings_view import findings_block
from workbench.display.nodes import Display, Node
from workbench.findings import Finding


class Displayable:
    """Shown in a notebook and printable from one `view()`."""

    def view(self) -> Display:
        raise NotImplementedError(f"{type(self).__name__} does not describe its view")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        view = self.view()
        return {"text/plain": view.text(), "text/html": view.html()}

    def __str__(self) -> str:
        return self.view().text()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


class Shown(Displayable):
    """Blocks a cell shows (HTML in a notebook, text when printed): a bare `Display` has no notebook rendering."""

    def __init__(self, display: Display) -> None:
        self.display = display

    def view(self) -> Display:
        return self.display


def _cached_findings(compute):
    @functools.wraps(compute)
    def findings(self) -> list[Finding]:
        cache = self.__dict__.get("_findings_cache")
        if cache is None:
            cache = compute(self)
            contract.enforce(type(self).__name__, contract.result_problems(cache))  # strict mode: at the source
            contract.log_verdicts(cache)
            self.__dict__["_findings_cache"] = cache
        return list(cache)

    findings.cached = True
    return findings


class ProbeResult(Displayable):
    """A probe's result: evidence (its fields), verdicts (`findings()`), its own blocks (`details()`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("findings")
        if callable(own) and not getattr(own, "cached", False):
            cls.findings = _cached_findings(own)

    def findings(self) -> list[Finding]:
        return []

    def details(self) -> Node | None:
        return None

    def view(self) -> Display:
        found = self.findings()
        return Display(findings_block(found) if found else None, self.details())

    def __repr__(self) -> str:
        verdicts = ", ".join(f"{f.id}: {f.verdict}" for f in self.findings())
        return f"<{type(self).__name__} {verdicts}>" if verdicts else f"<{type(self).__name__}>"
