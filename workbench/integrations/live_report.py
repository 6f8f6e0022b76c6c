"""The callback's report: one dated folder under `output_dir/workbench/`, written by the pre-flight and appended to
by the autopsy, in the report contract (findings.json, schema version 1; index.html; one HTML page per notebook).

    report = LiveReport.create(output_dir, name, diagnosis)   # output_dir/workbench/YYYY-MM-DD/HHMMSS-name/
    ran = run_preflight(trainer, model, tokenizer, report.diagnosis, report.folder)   # parts run and assembled
    report.publish(ran)     # findings.json and index.html rewritten, and output_dir/workbench/index.html
    report.write_pages()    # each notebook's page, with its figures

The diagnosis (`report.diagnosis.Diagnosis`) is the one `workbench diagnose` assembles its report with: the same
parts, the same answers rule, the same writer.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from workbench.findings import Finding, write_text_atomic
from workbench.report.contract import redact_report

REPORT_FOLDER = "workbench"  # under the Trainer's output_dir


@dataclasses.dataclass
class LiveReport:
    folder: Path
    diagnosis: object  # report.diagnosis.Diagnosis: its report is findings.json and index.html
    pending: set = dataclasses.field(default_factory=set)  # parts whose page is not written since they last ran

    @classmethod
    def create(cls, output_dir: str | Path, name: str, diagnosis) -> LiveReport:
        from workbench.report.runner import new_report_folder

        temp, final = new_report_folder(Path(output_dir) / REPORT_FOLDER, name, diagnosis.report.created)
        os.replace(temp, final)  # appended to while training runs: no half-report rename at the end
        return cls(final, diagnosis)

    @property
    def index(self) -> Path:
        return self.folder / "index.html"

    @property
    def findings(self) -> list[Finding]:
        return self.diagnosis.findings

    def publish(self, ran=()) -> None:
        """`ran`: the parts that just ran. findings.json and index.html, then `output_dir/workbench/index.html`: every callback report of this
        output_dir, newest first, as `reports/index.html` lists diagnoses. Each notebook row links its page, which
        `write_pages` writes (its figures take longer than the checks: once training has ended or stopped)."""
        self.pending |= set(ran)
        for row in self.diagnosis.report.notebooks:
            row.html = f"{row.name}.html"
        self.diagnosis.publish(self.folder, listing=self.folder.parent.parent,
                               listing_title="WorkbenchCallback reports of this output_dir")

    def write_pages(self) -> None:
        """Each notebook's page not written since it last ran: its findings, then each step's result."""
        pending, self.pending = self.pending & set(self.diagnosis.sessions), set()  # parts that ran here
        for name in pending:
            write_text_atomic(self.folder / f"{name}.html", _page(name, self.diagnosis))
        if pending:
            redact_report(self.folder)


def _page(name: str, diagnosis) -> str:
    """A notebook's page: its findings, then each step's result, rendered by the display model."""
    from workbench.display.nodes import Display, Heading
    from workbench.report.index_page import page

    body = [Heading(f"{name} · from the training callback", level=1), diagnosis.sessions[name].recorder.view()]
    for label, result in diagnosis.shown[name]:
        body.append(Heading(label, level=2))
        body.append(result.view() if hasattr(result, "view") else None)
    return page(name, Display(*body))
