"""Display blocks shared by result objects and the report index: verdict badges, the findings table, figures.

They are built from `workbench.display.nodes`, which escapes everything interpolated."""

from __future__ import annotations

import json
from typing import Any, Callable, Collection, Iterable

from workbench.display.nodes import (
    Badge,
    Bold,
    Code,
    Details,
    Display,
    Figure,
    Inline,
    Italic,
    Line,
    Link,
    Paragraph,
    Pre,
    Table,
    esc,
)
from workbench.findings import Finding, sort_findings

__all__ = ["findings_block", "findings_lines", "figure"]

MAX_EVIDENCE = 6000  # characters of evidence shown inline; findings.json keeps all of it


def findings_block(findings: Iterable[Finding], link_notebooks: bool | Collection[str] = False) -> Table:
    """Worst first: verdict, check, title with detail and fix (evidence folded), notebook. `link_notebooks`: link
    each finding's notebook page (True: every one; a collection: the notebooks whose page exists)."""
    rows = []
    findings = sort_findings(findings)
    located = any(f.notebook for f in findings)  # a result's own table (no notebook yet): no empty column
    for f in findings:
        linked = link_notebooks is True or (not isinstance(link_notebooks, bool) and f.notebook in link_notebooks)
        where = Link(f"{f.notebook}.html", f.notebook) if linked and f.notebook else (f.notebook or "")
        evidence = json.dumps(f.evidence, indent=1, default=str)
        if len(evidence) > MAX_EVIDENCE:
            evidence = evidence[:MAX_EVIDENCE] + "\n… (truncated; full evidence in findings.json)"
        finding = Inline(Bold(f.title), Line(f.detail), Line(Italic("Fix:"), " ", f.fix) if f.fix else None,
                         Details("evidence", Pre(evidence)))
        rows.append([Badge(f.verdict), Code(f.id), finding] + ([where] if located else []))
    return Table(["verdict", "check", "finding"] + (["notebook"] if located else []), rows, css_class="wb-findings",
                 left=True)


def findings_lines(findings: Iterable[Finding]) -> Display:
    """One line per finding, worst first: verdict, check, title (the console's summary; the report has the rest)."""
    return Display(*(Paragraph(Badge(f.verdict), " ", Code(f.id), ": ", f.title) for f in sort_findings(findings)))


def figure(draw: Callable[[], Any], alt: str) -> Figure:
    """What `draw()` plots (a matplotlib figure) as an inline PNG: static, offline, no widget needed.

    Drawn only when the HTML is asked for: the text view shows `alt` and needs no matplotlib."""
    def png() -> str:
        import base64
        import io

        import matplotlib.pyplot as plt

        fig, buf = draw(), io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'

    return Figure(png, alt)
