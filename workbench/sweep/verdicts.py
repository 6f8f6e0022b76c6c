"""sweep.json, and the one rule that reads a history: the first member at which a check turned bad.

    {"engine": "local" | "ray",
     "members": [{"name", "path", "report", "exit_code", "verdicts": {check id: verdict}}],
     "first_bad": {check id: member name}}

`first_bad` (a history only; a sweep of runs has no order, so it is empty): for each check, the first member whose
verdict is `fail` or `error` right after a member where it was not. A check bad from the first member on has no
first_bad: the history does not show when it turned (it was bad before), and naming the first member would be a
guess. A member with no report (exit 2) answers nothing: it is passed over, neither good nor bad. The page's
`first_turned(..., WARNING)` is the same rule with `warn` counted too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from workbench.findings import FAILING_VERDICTS

WARNING = frozenset({"warn"}) | FAILING_VERDICTS


def first_turned(members: Iterable[dict[str, Any]], bad: frozenset[str] = FAILING_VERDICTS) -> dict[str, str]:
    """check id -> the name of the first member whose verdict is in `bad` after a member where it was not."""
    found: dict[str, str] = {}
    before: dict[str, bool] = {}  # check id -> was it bad in the last member that answered it
    for member in members:
        for check, verdict in member.get("verdicts", {}).items():
            now = verdict in bad
            if now and before.get(check) is False and check not in found:
                found[check] = member["name"]
            before[check] = now
    return found


def sweep_document(engine: str, outcomes, sweep_dir: Path, history: bool) -> dict[str, Any]:
    """sweep.json's content; member reports as paths relative to the sweep's folder."""
    members = [{"name": o.name, "path": o.path,
                "report": str(Path(o.report).relative_to(sweep_dir)) if o.report else None,
                "exit_code": o.exit_code, "verdicts": dict(o.verdicts)} for o in outcomes]
    return {"engine": engine, "members": members, "first_bad": first_turned(members) if history else {}}


def worst_exit(outcomes) -> int:
    """The sweep's exit code: its worst member's (2 over 1 over 0)."""
    return max((o.exit_code for o in outcomes), default=0)
