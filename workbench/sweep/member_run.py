"""One member's diagnosis, wherever it runs (this process, a local worker process, a Ray task): `diagnose`'s own
path (`diagnose_command.diagnose_as_asked`) with the member as CKPT, its report moved to the folder the sweep gives it.

What comes back is small and picklable (`MemberOutcome`): the report folder, the exit code `diagnose` would give,
one verdict per check. A member that cannot be diagnosed (its folder is no checkpoint, a crash of ours) is an
outcome too, with exit code 2 and the reason: the other members still run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable

from workbench.errors import UsageError
from workbench.sweep.members import Member

USAGE_EXIT = 2


@dataclasses.dataclass
class MemberOutcome:
    name: str
    path: str
    report: str | None  # the member's report folder (None: no report was made)
    exit_code: int  # 0 clean, 1 a fail or error, 2 unusable input or a crash (as `diagnose`)
    verdicts: dict[str, str]  # check id -> its worst verdict in the report
    seconds: float
    error: str | None = None  # why there is no report
    host: str = ""  # where it ran: hostname and process id
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # earlier attempts lost (Ray)


def member_options(args: argparse.Namespace, member: Member) -> argparse.Namespace:
    """`diagnose`'s options for this member: the sweep's, with the member as CKPT."""
    return argparse.Namespace(**{**vars(args), "checkpoint": str(member.path), "run_checkpoint": None})


def diagnose_member(member: Member, args: argparse.Namespace, into: Path,
                    echo: Callable[[str], None] | None = None, kept_kernel=None) -> MemberOutcome:
    """Diagnose `member` as `diagnose` would, its report ending at `into` (a folder not yet there). `kept_kernel`:
    the kernel of the sweep's members in series (`diagnose_as_asked`)."""
    from workbench.report.runner import exit_code

    start = time.monotonic()
    host = f"{socket.gethostname()}:{os.getpid()}"
    scratch = into.parent / f".{into.name}.reports"  # diagnose's dated folders, emptied once the report is moved
    echo = echo or (lambda line: print(f"[{member.name}] {line}", flush=True))
    try:
        folder, findings = _diagnose(member_options(args, member), scratch, echo, kept_kernel)
    except UsageError as exc:
        return MemberOutcome(member.name, str(member.path), None, USAGE_EXIT, {}, _since(start), str(exc), host)
    except Exception as exc:  # noqa: BLE001 - a crash on one member leaves the others' reports
        return MemberOutcome(member.name, str(member.path), None, USAGE_EXIT, {}, _since(start),
                             f"the workbench crashed: {type(exc).__name__}: {exc}", host)
    into.parent.mkdir(parents=True, exist_ok=True)
    os.replace(folder, into)
    shutil.rmtree(scratch, ignore_errors=True)
    verdicts = report_verdicts(findings)
    return MemberOutcome(member.name, str(member.path), str(into), exit_code(findings), verdicts, _since(start),
                         host=host)


def _diagnose(args, reports_dir: Path, echo, kept_kernel=None):
    from workbench.diagnose_command import diagnose_as_asked

    return diagnose_as_asked(args, jobs=1, reports_dir=reports_dir, echo=echo, kept_kernel=kept_kernel)


def report_verdicts(findings) -> dict[str, str]:
    """check id -> the worst verdict the report gives it (one finding per check, but a check answered twice counts
    by its worst)."""
    from workbench.findings import worst_verdict

    by_check: dict[str, list[str]] = {}
    for f in findings:
        by_check.setdefault(f.id, []).append(f.verdict)
    return {check: worst_verdict(verdicts) for check, verdicts in sorted(by_check.items())}


def _since(start: float) -> float:
    return round(time.monotonic() - start, 2)


def record_engine_cost(outcome: MemberOutcome, engine: str) -> None:
    """The member's cost block says where the sweep ran it and every attempt a lost worker cost (findings.json and
    its index.html rewritten; secrets redacted again)."""
    if outcome.report is None:
        return
    import json

    from workbench.findings import write_json_atomic
    from workbench.report.contract import redact_report
    from workbench.report.index_page import write_index

    folder = Path(outcome.report)
    report = json.loads((folder / "findings.json").read_text())
    report["cost"] = {**(report.get("cost") or {}), "sweep": {
        "engine": engine, "host": outcome.host, "attempts": len(outcome.attempts) + 1,
        "lost_attempts": outcome.attempts, "seconds": outcome.seconds}}
    write_json_atomic(folder / "findings.json", report)
    write_index(folder, report)
    redact_report(folder)
