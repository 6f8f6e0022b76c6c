"""The report contract, written in one place: `findings.json` (schema version 1) and the report's `index.html`.

    report = Report.start(target.as_contract())                   # run_id and creation time
    report.add(NotebookRun("04_forward_checks", "ok", "04_forward_checks.html", 3.2), findings)
    report.write(folder)                                           # findings.json, index.html, secrets redacted

Both ways a report is made write through it: the runner (`workbench diagnose`: papermill, one notebook after
another) and the Trainer callback (`integrations/live_report.py`: notebooks run in the training process, appended to
as training goes on). A notebook added again replaces its earlier row and findings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from pathlib import Path
from typing import Any

from workbench.findings import Finding, sort_findings, write_json_atomic, write_text_atomic

SCHEMA_VERSION = 1


@dataclasses.dataclass
class NotebookRun:
    """One notebook's row in findings.json."""

    name: str
    status: str  # ok | error
    html: str | None
    seconds: float
    error: str | None = None
    kernel: str = "shared"  # shared | fresh (after the previous notebook killed or hung its kernel) | own


@dataclasses.dataclass
class Report:
    created: dt.datetime
    target: dict[str, Any]
    run_id: str
    notebooks: list[NotebookRun] = dataclasses.field(default_factory=list)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    cost: dict[str, Any] | None = None  # the runner's: loads, seconds, memory
    explanation: dict[str, Any] | None = None  # `workbench explain --ckpt`: the symptom and its causes, judged
    environment: dict[str, Any] | None = None  # where the notebooks ran (their kernel's); None: this process's

    @classmethod
    def start(cls, target: dict[str, Any], now: dt.datetime | None = None) -> Report:
        now = now or dt.datetime.now().astimezone()
        return cls(now, target, f"{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}")

    def add(self, run: NotebookRun, findings: list[Finding]) -> None:
        """A notebook's row and findings; a notebook added again replaces its earlier ones."""
        self.notebooks = [n for n in self.notebooks if n.name != run.name] + [run]
        self.findings = [f for f in self.findings if f.notebook != run.name] + [
            dataclasses.replace(f, notebook=run.name) for f in findings]

    def as_dict(self) -> dict[str, Any]:
        from workbench.environment import environment_facts

        data = {"schema_version": SCHEMA_VERSION, "run_id": self.run_id,
                "created": self.created.isoformat(timespec="seconds"), "target": self.target,
                "environment": self.environment or environment_facts(),
                "notebooks": [dataclasses.asdict(r) for r in self.notebooks],
                "findings": [f.to_dict() for f in sort_findings(self.findings)]}
        if self.cost is not None:
            data["cost"] = self.cost
        if self.explanation is not None:
            data["explanation"] = self.explanation
        return data

    def write(self, folder: Path, lead=None) -> dict[str, Any]:
        """findings.json and index.html into `folder`, secrets redacted from every page there; the contract.
        `lead`: a Display shown above the findings (explain's symptom and causes)."""
        from workbench.contract import log_verdicts
        from workbench.report.index_page import render_index

        log_verdicts(self.findings)  # the runner's own answers (skips, unreported checks) count for the test suite
        report = self.as_dict()
        write_json_atomic(folder / "findings.json", report)
        write_text_atomic(folder / "index.html", render_index(report, lead))
        redact_report(folder)
        return report


def redact_report(folder: Path) -> None:
    """Secrets from the environment must not leave the machine inside a shared report (tracebacks included)."""
    from workbench.environment import redact_text, secret_values

    secrets = secret_values()
    if not secrets:
        return
    for path in folder.iterdir():
        if path.suffix in (".html", ".json", ".ipynb", ".log") and path.is_file():
            text = path.read_text(errors="replace")
            cleaned = redact_text(text, secrets)
            if cleaned != text:
                path.write_text(cleaned)
