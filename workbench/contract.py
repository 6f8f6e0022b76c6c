"""The check contract, enforced in one place: a step answers each check it declares exactly once, with a verdict
that check's catalog entry declares (`error` and `skip` are always allowed: the check could not run, or does not
apply).

    problems = contract_problems("fp16", ("train.fp16",), findings, answered={})   # [] when the answers keep it
    answer = broken_contract_finding("train.fp16", "fp16", problems, findings)   # what a report shows instead

`FindingsRecorder` applies it to every step of every driver (report notebooks, the panel, the Trainer callback,
the architecture census); `ProbeResult.findings()` applies the per-result part (one finding per check, declared
verdicts) where a probe is called directly. A broken answer never passes silently: under `WORKBENCH_STRICT_CONTRACT=1`
(the test suite sets it, and kernels and torchrun ranks inherit it) it raises `ContractViolation`; otherwise the
check's answer becomes an `error` finding naming the step and carrying what the probe said.

`WORKBENCH_VERDICT_LOG=DIR` makes every process append the (check, verdict) pairs its probes produce to
`DIR/<pid>.tsv`: the test suite's verdict coverage (tests/conftest.py) reads them.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from pathlib import Path
from typing import Iterable, Mapping

from workbench.findings import Finding

STRICT_ENV = "WORKBENCH_STRICT_CONTRACT"
VERDICT_LOG_ENV = "WORKBENCH_VERDICT_LOG"
ALWAYS_ALLOWED = frozenset({"error", "skip"})


class ContractViolation(Exception):
    """A step broke the check contract (raised only in strict mode; else its checks get an `error`)."""


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def allowed_verdicts(check_id: str) -> frozenset[str] | None:
    """The verdicts the catalog declares for `check_id`, plus error and skip; None for an id it does not know."""
    from workbench.catalog import CHECKS_BY_ID

    check = CHECKS_BY_ID.get(check_id)
    return None if check is None else frozenset(check.verdicts) | ALWAYS_ALLOWED


def result_problems(findings: Iterable[Finding]) -> dict[str, list[str]]:
    """What breaks the contract within one probe result: a check answered twice, a verdict its entry does not
    declare. {check id: [problem, ...]}."""
    problems: dict[str, list[str]] = collections.defaultdict(list)
    by_id: dict[str, list[Finding]] = collections.defaultdict(list)
    for f in findings:
        by_id[f.id].append(f)
    for check_id, answers in by_id.items():
        if len(answers) > 1:
            problems[check_id].append(f"answered {len(answers)} times in one result (verdicts "
                                      f"{', '.join(a.verdict for a in answers)}): a probe that judges several "
                                      "things combines them into one finding (workbench.findings.combine_findings)")
        allowed = allowed_verdicts(check_id)
        for f in answers:
            if allowed is not None and f.verdict not in allowed:
                problems[check_id].append(f"verdict {f.verdict!r} is not one {check_id} declares "
                                          f"({', '.join(sorted(allowed))}): {f.title}")
    return dict(problems)


def contract_problems(step: str, declared: tuple[str, ...] | None, findings: list[Finding],
                      answered: Mapping[str, str], known_ids: Iterable[str] = ()) -> dict[str, list[str]]:
    """Every way `step`'s answer `findings` breaks the contract, by check id.

    `declared`: the checks the step declares (None: it declares none, e.g. a driver's own `add`); `answered`:
    check id -> the other step of this notebook that already answered it; `known_ids`: ids allowed beyond the
    catalog's (a notebook of your own declares its own)."""
    problems = collections.defaultdict(list, {k: list(v) for k, v in result_problems(findings).items()})
    known = set(known_ids) | set(declared or ())
    for f in findings:
        if declared is not None and f.id not in declared:
            problems[f.id].append(f"step {step!r} answers {f.id}, which it does not declare (it declares "
                                  f"{', '.join(declared) or 'no check'})")
        elif allowed_verdicts(f.id) is None and f.id not in known:
            problems[f.id].append(f"{f.id} is not a check of workbench.catalog, and no step declares it")
        if f.id in answered:
            problems[f.id].append(f"already answered in this notebook by step {answered[f.id]!r}; step {step!r} "
                                  "answers it again")
    for check_id in declared or ():
        if not any(f.id == check_id for f in findings):
            problems[check_id].append(f"step {step!r} declares {check_id} but did not answer it")
    return {k: v for k, v in problems.items() if v}


def broken_contract_finding(check_id: str, step: str, problems: list[str], findings: list[Finding]) -> Finding:
    """The `error` a check gets when its answer broke the contract: what the probe said stays in the evidence."""
    said = [f.to_dict() for f in findings if f.id == check_id]
    return Finding(check_id, "error", f"{check_id}: step {step!r} broke the check contract", "; ".join(problems),
                   {"step": step, "problems": problems, "answers": said},
                   "A defect of the workbench's probe, not of your model: the probe's own answers are in the "
                   "evidence; report it with this finding.")


def enforce(step: str, problems: Mapping[str, list[str]]) -> None:
    """Strict mode: raise on any problem."""
    if problems and strict():
        raise ContractViolation("; ".join(f"{check_id}: {p}" for check_id, ps in problems.items() for p in ps)
                                + f" (step {step!r})")


def log_verdicts(findings: Iterable[Finding]) -> None:
    """Append (check, verdict) pairs to this process's verdict log, when one is asked for."""
    folder = os.environ.get(VERDICT_LOG_ENV)
    if not folder:
        return
    lines = "".join(f"{f.id}\t{f.verdict}\n" for f in findings)
    if lines:
        try:
            with open(Path(folder) / f"{os.getpid()}.tsv", "a") as log:
                log.write(lines)
        except OSError:
            pass  # the log serves the test suite's coverage; a report never fails for it


def read_verdict_logs(folder: str | Path) -> set[tuple[str, str]]:
    """Every (check, verdict) pair the processes logged into `folder`."""
    pairs: set[tuple[str, str]] = set()
    for path in Path(folder).glob("*.tsv"):
        for line in path.read_text().splitlines():
            check_id, _, verdict = line.partition("\t")
            if verdict:
                pairs.add((check_id, verdict))
    return pairs


def coverage_gaps(produced: set[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(declared verdicts no test produced, produced verdicts nothing declares), as "check: verdict"."""
    from workbench.catalog import CHECKS

    declared = {(c.id, v) for c in CHECKS for v in c.verdicts}
    missing = sorted(f"{c}: {v}" for c, v in declared - produced)
    undeclared = sorted(f"{c}: {v}" for c, v in produced
                        if (allowed := allowed_verdicts(c)) is not None and v not in allowed)
    return missing, undeclared


def notebook_answers(notebook: str, declared: Iterable[str], findings: list[Finding], stopped: str) -> list[Finding]:
    """A notebook's findings as a report keeps them: one per check. A declared check the notebook never answered
    gets an `error` (`stopped`: why, e.g. the cell it died in); a check answered twice, or with a verdict it does not
    declare (a sidecar no recorder wrote, a notebook of your own), gets the broken-contract `error`."""
    problems = result_problems(findings)
    answers = [f for f in findings if f.id not in problems]
    answers += [broken_contract_finding(check_id, notebook, why, findings) for check_id, why in problems.items()]
    seen = {f.id for f in answers}
    answers += [Finding(check_id, "error", f"{check_id} was not reported", f"{notebook} stopped before this check: "
                        f"{stopped}", {"notebook_error": stopped}, "Open the notebook's HTML to see the failing cell; "
                        "fix the input or report the bug.")
                for check_id in declared if check_id not in seen]
    return [dataclasses.replace(f, notebook=notebook) for f in answers]
