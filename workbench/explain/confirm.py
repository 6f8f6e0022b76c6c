"""Confirming an explanation on the user's model: run exactly the checks its causes name, no other notebook step.

    confirm_checks(explanation, target, folder)   # marks each cause confirmed / ruled out, returns the findings

For each named check the catalog gives the step of its notebook that answers it; that step runs with the steps it
reads (its inputs, optional ones included), through a `NotebookSession` and a `FindingsRecorder` as a report
notebook runs them, so the verdicts are the diagnosis' own. Steps that load their own copy of the model run before
the shared one is prepared (never two copies resident). A cause is confirmed when one of its checks answers a
verdict the cause names (`confirms`, default fail or warn), ruled out when every one of its checks answered and none
did, and left open (None) when a check was skipped, could not run, or the cause names no check.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from workbench.catalog import CHECKS_BY_ID, NotebookSpec, notebook
from workbench.catalog import Step as CatalogStep
from workbench.findings import Finding

UNANSWERED = ("skip", "error")


def named_checks(explanation) -> list[str]:
    """The checks the ranked causes name, in rank order, each once."""
    return list(dict.fromkeys(c for cause in explanation.causes for c in cause.cause.checks))


def steps_for(check: str) -> tuple[NotebookSpec, list[CatalogStep]]:
    """The notebook of `check` and the steps that answer it, with the earlier steps they read, in notebook order."""
    spec = notebook(CHECKS_BY_ID[check].notebook)
    names = {s.name for s in spec.steps}
    wanted: set[str] = set()
    stack = [s.name for s in spec.steps if check in s.reports]
    while stack:
        name = stack.pop()
        if name in wanted:
            continue
        wanted.add(name)
        step = spec.step(name)
        for ref in (*step.args, *step.kwargs.values()):
            dep = ref.rstrip("?")
            if dep in names:
                stack.append(dep)
    return spec, [s for s in spec.steps if s.name in wanted]


@dataclasses.dataclass
class Confirmation:
    checks: list[str]
    findings: dict[str, Finding]
    seconds: float
    notebooks: list[str]

    def as_dict(self, target: str, report: str | None) -> dict[str, Any]:
        return {"target": target, "checks": self.checks, "notebooks": self.notebooks,
                "seconds": round(self.seconds, 1), "report": report}


def run_checks(target, checks: list[str], folder: Path) -> Confirmation:
    """Run the steps that answer `checks` on `target`; the answers of those checks (other checks a step answers on
    the way are not reported: they were not asked)."""
    from workbench.notebook import NOTEBOOK_PARAMETERS, NotebookSession
    from workbench.recorder import FindingsRecorder

    start = time.monotonic()
    plan: dict[str, tuple[NotebookSpec, list[CatalogStep]]] = {}
    for check in checks:
        spec, steps = steps_for(check)
        known = plan.get(spec.name, (spec, []))[1]
        plan[spec.name] = (spec, known + [s for s in steps if s not in known])
    findings: dict[str, Finding] = {}
    sessions = {}
    for name, (spec, _steps) in plan.items():
        if spec.needs_model and target.model_unavailable:
            for check in (c for c in checks if CHECKS_BY_ID[c].notebook == name):
                findings[check] = Finding(check, "skip", "The model could not be resolved", target.model_unavailable,
                                          {"notebook": name}, target.base_fix or "")
            continue
        options = {**NOTEBOOK_PARAMETERS, **target.options()}
        if name == "06_distributed":
            options["distributed"] = 2  # the DDP / FSDP2 probes under torchrun with two ranks
        recorder = FindingsRecorder(folder / f"findings.{name}.json", notebook=name, autosave=False)
        sessions[name] = NotebookSession(spec, target, recorder, options)
    ordered = [(name, step) for name, (_spec, steps) in plan.items() if name in sessions for step in steps]
    # steps that load and free their own copy first: never two copies of the model resident
    for name, step in [o for o in ordered if o[1].own_model] + [o for o in ordered if not o[1].own_model]:
        sessions[name].run(step.name)
    for name, session in sessions.items():
        session.recorder.save()
        for f in session.recorder.findings:
            if f.id in checks:
                findings[f.id] = f
    from workbench.model.shared import free_shared

    free_shared()
    return Confirmation(checks, findings, time.monotonic() - start, list(plan))


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
    from workbench.report.contract import NotebookRun, Report
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
    report = Report.start(target.as_contract())
    temp, final = new_report_folder(reports_dir, f"explain-{explanation.symptom.id}", report.created)
    try:
        confirmation = run_checks(target, checks, temp)
        judge(explanation, confirmation.findings)
        for name in confirmation.notebooks:
            found = [f for f in confirmation.findings.values() if CHECKS_BY_ID[f.id].notebook == name]
            report.add(NotebookRun(name, "ok", None, 0.0), found)
        explanation.confirmation = confirmation.as_dict(args.ckpt, str(final))
        report.explanation = explanation.as_dict()
        report.write(temp, lead=explanation.view())
        temp.rename(final)
    except BaseException:
        import shutil

        shutil.rmtree(temp, ignore_errors=True)
        raise
    return 1 if any(c.confirmed for c in explanation.causes) else 0
