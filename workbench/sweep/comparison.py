"""The comparison page's blocks, read from a finished sweep's folder (sweep.json and each member's findings.json):
what notebooks/12_sweep.ipynb shows, one call per cell.

    sweep = load_sweep(sweep_dir, history=True)
    sweep.members_view()   # each member: exit code, report, time
    sweep.checks_view()    # checks × members, verdict colours, each cell a link to the member's finding
    sweep.turned_view()    # a history: the first member at which each check turned warn/fail
    sweep.changes_view()   # ... and what changed between that member and the one before
    sweep.plots_view()     # per-member numbers: adapter update norm, loss at save, eval metrics
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

from workbench.display.findings_view import figure
from workbench.display.nodes import Badge, Bold, Code, Display, Heading, Link, Paragraph, Table
from workbench.display.result import Shown
from workbench.findings import verdict_rank
from workbench.sweep.changes import MemberFacts, changes, read_facts
from workbench.sweep.verdicts import WARNING, first_turned

MAX_CHANGES = 40  # rows of differences shown per member (every one is counted)


@dataclasses.dataclass
class Sweep:
    folder: Path
    document: dict[str, Any]  # sweep.json
    reports: dict[str, dict[str, Any]]  # member name -> its findings.json (members with a report)
    history: bool

    @property
    def members(self) -> list[dict[str, Any]]:
        return self.document["members"]

    @property
    def checks(self) -> list[str]:
        """Every check some member answered, worst-hit first (by its worst verdict, then its id)."""
        worst: dict[str, int] = {}
        for member in self.members:
            for check, verdict in member["verdicts"].items():
                worst[check] = min(worst.get(check, 99), verdict_rank(verdict))
        return sorted(worst, key=lambda c: (worst[c], c))

    def finding(self, member: str, check: str) -> dict[str, Any] | None:
        found = [f for f in self.reports.get(member, {}).get("findings", []) if f["id"] == check]
        return min(found, key=lambda f: verdict_rank(f["verdict"])) if found else None

    def finding_link(self, member: dict[str, Any], check: str) -> str:
        """The member's page that shows the finding: its notebook's page, else the member's index."""
        finding = self.finding(member["name"], check) or {}
        page = f"{finding.get('notebook')}.html"
        report = Path(member["report"])
        return str(report / page) if (self.folder / report / page).is_file() else str(report / "index.html")

    @functools.cached_property
    def facts(self) -> list[MemberFacts]:
        """Each member's saved files, read once for the changes and the plots."""
        return [read_facts(m["name"], Path(m["path"])) for m in self.members]

    # -- blocks ---------------------------------------------------------------------------------------------
    def members_view(self) -> Shown:
        rows = []
        for member in self.members:
            report = self.reports.get(member["name"])
            cost = (report or {}).get("cost") or {}
            sweep_cost = cost.get("sweep") or {}
            rows.append([Bold(member["name"]), Code(member["path"]), str(member["exit_code"]),
                         Link(f"{member['report']}/index.html", "report") if member["report"] else "no report",
                         f"{sweep_cost.get('seconds', cost.get('seconds', 0)):.1f} s" if report else "",
                         f"{sweep_cost['attempts']} (a lost worker retried)" if sweep_cost.get("attempts", 1) > 1
                         else ""])
        return Shown(Display(
            Paragraph(f"{len(self.members)} members, engine {self.document['engine']}"
                      + (", one run's checkpoints in step order" if self.history else "") + "; exit code "
                      + f"{max((m['exit_code'] for m in self.members), default=0)} (the worst member's)."),
            Table(["member", "path", "exit code", "report", "time", "attempts"], rows, left=True)))

    def checks_view(self) -> Shown:
        names = [m["name"] for m in self.members]
        rows = []
        for check in self.checks:
            cells = []
            for member in self.members:
                verdict = member["verdicts"].get(check)
                cells.append(Link(self.finding_link(member, check), Badge(verdict)) if verdict else "—")
            rows.append([Code(check), *cells])
        return Shown(Display(Table(["check", *names], rows, row_headers=True)))

    def turned_view(self) -> Shown:
        if not self.history:
            return Shown(Display(Paragraph("Not a history: the members are compared side by side, in no order "
                                           "(pass --history with one output_dir for when each check turned).")))
        warned, bad = first_turned(self.members, WARNING), self.document.get("first_bad", {})
        if not warned:
            return Shown(Display(Paragraph("No check turned warn, fail or error from one checkpoint to the next.")))
        order = {m["name"]: i for i, m in enumerate(self.members)}
        rows = []
        for check, name in sorted(warned.items(), key=lambda kv: (order[kv[1]], kv[0])):
            member = self.members[order[name]]
            finding = self.finding(name, check) or {}
            rows.append([Code(check), Bold(name), Link(self.finding_link(member, check), Badge(
                member["verdicts"][check])), finding.get("title", ""),
                f"first bad: {bad[check]}" if check in bad else ""])
        return Shown(Display(
            Paragraph("The first member at which each check turned warn, fail or error after a member where it was "
                      "not (sweep.json's first_bad counts fail and error only; a check bad from the first member on "
                      "has none: the history does not show when it turned)."),
            Table(["check", "first turned at", "verdict", "finding", "sweep.json"], rows, left=True)))

    def changes_view(self) -> Shown:
        if not self.history:
            return Shown(Display(Paragraph("Not a history: no member comes before another to compare with.")))
        order = {m["name"]: i for i, m in enumerate(self.members)}
        turned = sorted({order[name] for name in first_turned(self.members, WARNING).values()})
        blocks = []
        for i in turned:
            before, after = self.facts[i - 1], self.facts[i]
            found = changes(before, after)
            checks = sorted(c for c, n in first_turned(self.members, WARNING).items() if order[n] == i)
            blocks.append(Heading(f"{after.name} against {before.name}: {', '.join(checks)} turned", level=3))
            if not found:
                blocks.append(Paragraph("No difference in the saved files read here (adapter, run log, configs, "
                                        "tokenizer, dtypes): the check's own finding says what it saw."))
                continue
            rows = [[c.what, Code(c.key), _value(c.before), _value(c.after)] for c in found[:MAX_CHANGES]]
            blocks.append(Table(["what", "key", before.name, after.name], rows, left=True))
            if len(found) > MAX_CHANGES:
                blocks.append(Paragraph(f"… and {len(found) - MAX_CHANGES} more differences."))
        return Shown(Display(*blocks))

    def plots_view(self) -> Shown:
        facts = self.facts
        series = {"adapter update norm √Σ‖B·A‖²": [f.update_norm for f in facts],
                  "training loss at save": [f.loss_at_save for f in facts]}
        for metric in sorted({k for f in facts for k in f.eval_metrics}):
            series[metric] = [f.eval_metrics.get(metric) for f in facts]
        series = {k: v for k, v in series.items() if any(x is not None for x in v)}
        if not series:
            return Shown(Display(Paragraph("No per-member numbers to plot (no adapter, no run log).")))
        names = [f.name for f in facts]
        return Shown(Display(figure(lambda: _plot(names, series), "per-member numbers: " + ", ".join(series))))


def load_sweep(folder: str | Path, history: bool = False) -> Sweep:
    """The sweep in `folder`; once the sweep's folder was renamed into place (the notebook ran in its hidden
    `.partial` folder), the folder the notebook is opened in (JupyterLab's working folder for it)."""
    folder = Path(folder)
    if not (folder / "sweep.json").is_file() and Path("sweep.json").is_file():
        folder = Path(".")
    document = json.loads((folder / "sweep.json").read_text())
    reports = {}
    for member in document["members"]:
        if member.get("report"):
            try:
                reports[member["name"]] = json.loads((folder / member["report"] / "findings.json").read_text())
            except (OSError, ValueError):
                continue
    return Sweep(folder, document, reports, history)


def _value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 120 else text[:117] + "…"


def _plot(names: list[str], series: dict[str, list[float | None]]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 2.2 * len(series)))
    axes = fig.subplots(len(series), 1, squeeze=False)[:, 0]
    xs = list(range(len(names)))
    for ax, (label, values) in zip(axes, series.items()):
        ys = [math.nan if v is None else v for v in values]
        ax.plot(xs, ys, marker="o", color="#1565c0")
        bad = [x for x, y in zip(xs, ys) if not math.isfinite(y)]
        for x in bad:  # a missing or non-finite number is marked, not dropped silently
            ax.axvline(x, color="#c62828", linestyle="--", linewidth=1)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(xs, names, fontsize=8, rotation=20)
    axes[0].set_title("Per member (red dashes: no finite value)", fontsize=10)
    fig.tight_layout()
    return fig
