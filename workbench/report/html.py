"""Small HTML renderers shared by result objects and the report index. Everything interpolated is escaped."""

from __future__ import annotations

import html
import json
from typing import Iterable

from workbench.findings import VERDICT_COLOURS, Finding, sort_findings

esc = html.escape
LEFT = ' style="text-align:left"'  # JupyterLab right-aligns table cells; prose reads left-aligned


def verdict_badge(verdict: str) -> str:
    colour = VERDICT_COLOURS.get(verdict, "#000")
    return (f'<span style="background:{colour};color:#fff;border-radius:3px;padding:1px 6px;'
            f'font-weight:600;font-size:0.85em">{esc(verdict.upper())}</span>')


def frame_html(frame) -> str:
    return frame.to_html(index=False, escape=True, border=0, classes="wb-table")


def findings_table(findings: Iterable[Finding], link_notebooks: bool = False) -> str:
    rows = []
    for f in sort_findings(findings):
        where = esc(f.notebook or "")
        if link_notebooks and f.notebook:
            where = f'<a href="{esc(f.notebook)}.html">{where}</a>'
        evidence = json.dumps(f.evidence, indent=1, default=str)
        if len(evidence) > 6000:
            evidence = evidence[:6000] + "\n… (truncated; full evidence in findings.json)"
        rows.append(
            f"<tr{LEFT}><td{LEFT}>{verdict_badge(f.verdict)}</td><td{LEFT}><code>{esc(f.id)}</code></td>"
            f"<td{LEFT}><b>{esc(f.title)}</b><div>{esc(f.detail)}</div>"
            + (f"<div><i>Fix:</i> {esc(f.fix)}</div>" if f.fix else "")
            + f"<details><summary>evidence</summary><pre>{esc(evidence)}</pre></details></td>"
            f"<td{LEFT}>{where}</td></tr>")
    head = "".join(f"<th{LEFT}>{h}</th>" for h in ("verdict", "check", "finding", "notebook"))
    return f'<table class="wb-findings"><thead><tr>{head}</tr></thead><tbody>' + "".join(rows) + "</tbody></table>"


def figure_html(fig) -> str:
    """A matplotlib figure as an inline PNG: static, offline, no widget needed."""
    import base64
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'
