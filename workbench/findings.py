"""The findings model: one verdict of one check, with its evidence and its fix.

Pure data: a probe returns a result object (`workbench.display.result.ProbeResult`), which turns its evidence into
`Finding`s; notebooks record them in a JSON sidecar (`FindingsRecorder`), which the report runner merges into
`findings.json`. How a finding looks is the display package's business (`workbench.display.findings_view`).

    >>> f = Finding("dtype.census", "pass", "Dtype census", "2 dtypes in 3 components")
    >>> f.to_dict()["verdict"]
    'pass'
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from pathlib import Path
from typing import Any, Iterable, Literal

Verdict = Literal["pass", "info", "warn", "fail", "error", "skip"]

# Worst first: the order a report lists findings in.
VERDICT_ORDER: tuple[Verdict, ...] = ("error", "fail", "warn", "info", "skip", "pass")
FAILING_VERDICTS = frozenset({"fail", "error"})


def verdict_rank(verdict: str) -> int:
    """0 for the worst verdict; unknown verdicts sort first so they are never hidden."""
    return VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else -1


def worst_verdict(verdicts: Iterable[str]) -> Verdict | None:
    ranked = sorted(verdicts, key=verdict_rank)
    return ranked[0] if ranked else None  # type: ignore[return-value]


@dataclasses.dataclass
class Finding:
    """One check's verdict. `error` = the check could not run; `fail` = it ran and found a defect."""

    id: str
    verdict: Verdict
    title: str
    detail: str = ""
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    fix: str = ""
    notebook: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICT_ORDER:
            raise ValueError(f"unknown verdict {self.verdict!r}; use one of {', '.join(VERDICT_ORDER)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    @classmethod
    def from_exception(cls, check_id: str, exc: BaseException, *, title: str | None = None) -> Finding:
        """The check crashed: an `error` finding carrying the exception and its traceback."""
        # an exception may carry its own title, evidence and fix (workbench.model.batch.BatchNotAccepted)
        return cls(
            id=check_id,
            verdict="error",
            title=title or getattr(exc, "finding_title", None) or f"{check_id} could not run",
            detail=f"{type(exc).__name__}: {exc}",
            evidence={**getattr(exc, "evidence", {}), "traceback": "".join(traceback.format_exception(exc))[-8000:]},
            fix=getattr(exc, "fix", None) or "Read the traceback in the evidence; if the input is at fault, fix it "
            "and re-run.",
        )


def combine_findings(findings: Iterable[Finding]) -> Finding:
    """One check's several judgements as its one answer: the worst verdict leads (its title, detail and evidence);
    the others follow in the detail and under `evidence["also"]`; every distinct fix is kept."""
    ranked = sorted(findings, key=lambda f: verdict_rank(f.verdict))
    if not ranked:
        raise ValueError("combine_findings needs at least one finding")
    if len({f.id for f in ranked}) > 1:
        raise ValueError(f"combine_findings combines one check's findings, not {sorted({f.id for f in ranked})}")
    lead, rest = ranked[0], ranked[1:]
    if not rest:
        return lead
    detail = " ".join([lead.detail, *(f"Also ({f.verdict}): {f.title}. {f.detail}" for f in rest)]).strip()
    fixes = list(dict.fromkeys(f.fix for f in ranked if f.fix))
    also = [{"verdict": f.verdict, "title": f.title, "detail": f.detail,
             **{k: v for k, v in f.evidence.items() if lead.evidence.get(k) != v}} for f in rest]
    return dataclasses.replace(lead, detail=detail, evidence={**lead.evidence, "also": also}, fix="\n".join(fixes))


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (verdict_rank(f.verdict), f.id))


def to_jsonable(value: Any) -> Any:
    """Evidence may hold dtypes, paths, tuples, numpy scalars: make it JSON without losing meaning."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return str(value)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write then rename, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(to_jsonable(data), indent=2, ensure_ascii=False))
