"""The callback's report: one dated folder under `output_dir/workbench/`, written by the pre-flight and appended to
by the autopsy, in the report contract (findings.json, schema version 1; index.html; one HTML page per notebook).

    report = LiveReport.create(output_dir, name)   # output_dir/workbench/YYYY-MM-DD/HHMMSS-name/
    report.add(runs)                               # NotebookRuns: findings.json and index.html rewritten, and
                                                   # output_dir/workbench/index.html, the list of reports
    report.write_pages()                           # each notebook's page, with its figures
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path
from typing import Any

from workbench.findings import Finding, write_text_atomic
from workbench.report.contract import NotebookRun, Report, redact_report

REPORT_FOLDER = "workbench"  # under the Trainer's output_dir


@dataclasses.dataclass
class LiveReport:
    folder: Path
    report: Report  # the contract: findings.json and index.html are written from it
    pending: list = dataclasses.field(default_factory=list)  # runs whose page is not written yet

    @classmethod
    def create(cls, output_dir: str | Path, name: str, target: dict[str, Any]) -> LiveReport:
        from workbench.report.runner import new_report_folder

        now = dt.datetime.now().astimezone()
        temp, final = new_report_folder(Path(output_dir) / REPORT_FOLDER, name, now)
        os.replace(temp, final)  # appended to while training runs: no half-report rename at the end
        return cls(final, Report.start(target, now))

    @property
    def index(self) -> Path:
        return self.folder / "index.html"

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings

    def add(self, runs) -> list[Finding]:
        """Merge each run's findings (a notebook run again replaces its earlier ones) and rewrite findings.json and
        index.html; each run's own page waits for `write_pages` (its figures take longer than the checks: the
        pre-flight writes them once training has ended or stopped). Returns the findings added."""
        added: list[Finding] = []
        for run in runs:
            self.report.add(NotebookRun(run.name, "ok", f"{run.name}.html", round(run.seconds, 2), kernel="own"),
                            run.findings)
            self.pending = [r for r in self.pending if r.name != run.name] + [run]
            added += run.findings
        self.write()
        return added

    def write_pages(self) -> None:
        """Each added run's page: its findings, then each step's result with its figures."""
        pending, self.pending = self.pending, []
        for run in pending:
            write_text_atomic(self.folder / f"{run.name}.html", _page(run))
        if pending:
            redact_report(self.folder)

    def contract(self) -> dict[str, Any]:
        return self.report.as_dict()

    def write(self) -> None:
        """findings.json and index.html, then `output_dir/workbench/index.html`: every callback report of this
        output_dir, newest first, as `reports/index.html` lists diagnoses."""
        from workbench.report.index_page import write_reports_index

        self.report.write(self.folder)
        write_reports_index(self.folder.parent.parent, title="WorkbenchCallback reports of this output_dir")


def _page(run) -> str:
    """A notebook's page: its findings, then each step's result, rendered by the display model."""
    from workbench.display.nodes import Display, Heading
    from workbench.report.index_page import page

    body = [Heading(f"{run.name} · from the training callback", level=1), run.recorder.view()]
    for label, result in run.results:
        body.append(Heading(label, level=2))
        body.append(result.view() if hasattr(result, "view") else None)
    return page(run.name, Display(*body))
