"""Confirming an explanation on the user's model: run exactly the checks its causes name, no other notebook step.

    confirmation = run_checks(plan_checks(target, checks), checks, folder)   # the answers of the named checks
    judge(explanation, confirmation.findings)      # each cause confirmed, ruled out or open, with its evidence

For each named check the catalog gives the step of its notebook that answers it; that step runs with the steps it
reads (its inputs, optional ones included), as a diagnosis with only those checks asked (`report.diagnosis`: the
same plan, `NotebookSession`, `FindingsRecorder` and answers rule as `workbench diagnose`), so the verdicts are the
diagnosis' own. Steps that load their own copy of the model run before the shared one is prepared (never two copies
resident). A cause is confirmed when one of its checks answers a
verdict the cause names (`confirms`, default fail or warn), ruled out when every one of its checks answered and none
did, and left open (None) when a check was skipped, could not run, or the cause names no check.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from workbench.catalog import CHECKS_BY_ID
from workbench.findings import Finding

UNANSWERED = ("skip", "error")


def named_checks(explanation) -> list[str]:
    """The checks the ranked causes name, in rank order, each once."""
    return list(dict.fromkeys(c for cause in explanation.causes for c in cause.cause.checks))


@dataclasses.dataclass
class Confirmation:
    checks: list[str]
    findings: dict[str, Finding]
    seconds: float
    notebooks: list[str]

    def as_dict(self, target: str, report: str | None) -> dict[str, Any]:
        return {"target": target, "checks": self.checks, "notebooks": self.notebooks,
                "seconds": round(self.seconds, 1), "report": report}


def plan_checks(target, checks: list[str]):
    """The diagnosis that answers `checks` on `target`: for each, the step of its notebook that answers it and the
    steps that step reads; only those checks are answered (other checks a step answers on the way were not asked).
    Notebook 06's probes run under torchrun with two ranks."""
    from workbench.report.diagnosis import Diagnosis, plan_part

    notebooks = list(dict.fromkeys(CHECKS_BY_ID[check].notebook for check in checks))
    return Diagnosis(target, [plan_part(target, name, asked=checks,
                                        options={"distributed": 2} if name == "06_distributed" else None)
                              for name in notebooks])


def run_checks(diagnosis, checks: list[str], folder: Path) -> Confirmation:
    """Run the planned steps here; the answers of the asked `checks`."""
    from workbench.model.shared import free_shared

    start = time.monotonic()
    diagnosis.run_in_process(folder)
    free_shared()
    return Confirmation(checks, {f.id: f for f in diagnosis.findings if f.id in checks}, time.monotonic() - start,
                        [part.name for part in diagnosis.parts])


def _confirming(cause, finding: Finding) -> tuple[bool, str | None]:
    """Whether the finding confirms the cause: a verdict it names and, where the cause says so (`confirms_if`), its
    title or detail saying what the cause needs (parallel.trainer_wrap warns both for a wrap and for a batch
    multiplied without one); the sentence that matched."""
    if finding.verdict not in cause.confirms:
        return False, None
    pattern = cause.confirms_if.get(finding.id)
    if pattern is None:
        return True, None
    import re

    text = f"{finding.title}. {finding.detail}"
    m = re.search(pattern, text)
    if m is None:
        return False, None
    start = max(text.rfind(". ", 0, m.start()) + 2, 0)
    end = text.find(". ", m.end())
    return True, text[start:end if end >= 0 else len(text)][:400]


def judge(explanation, findings: dict[str, Finding]) -> None:
    """Mark each cause confirmed (True), ruled out (False) or open (None), with the findings as its evidence."""
    for ranked in explanation.causes:
        answers = [findings[c] for c in ranked.cause.checks if c in findings]
        judged = [(f, *_confirming(ranked.cause, f)) for f in answers]
        ranked.evidence = [{"check": f.id, "verdict": f.verdict, "title": f.title, "detail": f.detail[:800],
                            "evidence": _compact(f.evidence), "fix": f.fix[:800], "confirms": confirms,
                            **({"because": because} if because else {})} for f, confirms, because in judged]
        if any(confirms for _, confirms, _ in judged):
            ranked.confirmed = True
        elif answers and len(answers) == len(ranked.cause.checks) and not any(
                f.verdict in UNANSWERED for f in answers):
            ranked.confirmed = False
        else:
            ranked.confirmed = None
    # confirmed causes first, then the open ones, the ruled-out last; the text's ranking within each
    order = {True: 0, None: 1, False: 2}
    explanation.causes.sort(key=lambda c: order[c.confirmed])


def _compact(evidence: dict[str, Any], limit: int = 2000) -> dict[str, Any]:
    """The finding's evidence, each value cut to what a terminal and findings.json can carry."""
    import json

    out = {}
    for key, value in evidence.items():
        text = json.dumps(value, default=str)
        out[key] = value if len(text) <= limit else text[:limit] + " …"
    return out


def confirm(explanation, args) -> int:
    """`workbench explain … --ckpt`: resolve the target as `diagnose` does, run the named checks, write the report
    (findings.json + index.html, the symptom on top). Exit 1 when a cause is confirmed."""
    from workbench.report.runner import check_reports_dir, new_report_folder

    checks = named_checks(explanation)
    reports_dir = Path(args.reports_dir)
    check_reports_dir(reports_dir)
    if args.training_args:
        from workbench.probes.train.configuration import read_training_args_file

        read_training_args_file(args.training_args)  # unknown fields: exit 2 now, naming them
    from workbench.model.target import resolve_target

    target = resolve_target(args.ckpt, base=args.base, quant=args.quant or "none", gpus=args.gpus, setup=args.setup,
                            data=args.data, training_args=args.training_args,
                            hub="cache" if getattr(args, "user_offline", False) else "headers")
    diagnosis = plan_checks(target, checks)
    temp, final = new_report_folder(reports_dir, f"explain-{explanation.symptom.id}", diagnosis.report.created)
    try:
        confirmation = run_checks(diagnosis, checks, temp)
        judge(explanation, confirmation.findings)
        explanation.confirmation = confirmation.as_dict(args.ckpt, str(final))
        diagnosis.report.explanation = explanation.as_dict()
        diagnosis.publish(temp, into=final, lead=explanation.view())
    except BaseException:
        import shutil

        shutil.rmtree(temp, ignore_errors=True)
        raise
    return 1 if any(c.confirmed for c in explanation.causes) else 0
