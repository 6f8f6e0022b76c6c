"""Where a check lives: the step that reports it, its probe's file and line, the result class, and its tests.

    python -m workbench checks --where grad.flow

One hop from a check id to its code (lm-eval's `Registry.origin` does this for its tasks). The probe is imported
to find its source, so this imports what the probe imports; `checks` without `--where` stays light.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

from workbench.catalog import check

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Place:
    path: str  # relative to the repository (or absolute outside it)
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name}"


@dataclasses.dataclass(frozen=True)
class CheckOrigin:
    check_id: str
    notebook: str
    steps: tuple[str, ...]
    probes: tuple[Place, ...]
    results: tuple[Place, ...]
    tests: tuple[Place, ...]

    def text(self) -> str:
        rows = [f"{self.check_id} (notebook {self.notebook}, step {', '.join(self.steps)})"]
        for label, places in (("probe", self.probes), ("result", self.results), ("tests", self.tests)):
            for i, place in enumerate(places or ("(none found)",)):
                rows.append(f"  {label if i == 0 else '':7} {place}")
        return "\n".join(rows)


def _relative(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def _place(obj) -> Place:
    """The `def` / `class` line itself (inspect starts at the first decorator)."""
    obj = inspect.unwrap(obj)
    lines, start = inspect.getsourcelines(obj)
    offset = next((i for i, line in enumerate(lines) if not line.lstrip().startswith("@")), 0)
    return Place(_relative(inspect.getsourcefile(obj)), start + offset, obj.__qualname__)


def _result_class(function) -> type | None:
    try:
        returned = typing.get_type_hints(inspect.unwrap(function)).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve names no class
        return None
    return returned if inspect.isclass(returned) else None


def _tests_naming(words: list[str], tests_dir: Path) -> list[Place]:
    """Each test function whose body names one of the words (the check id, the probe's function name)."""
    pattern = re.compile("|".join(re.escape(w) for w in words))
    found: list[Place] = []
    for path in sorted(tests_dir.glob("**/test_*.py")):
        current: tuple[int, str] | None = None
        seen: set[str] = set()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            head = re.match(r"(?:async )?def (test_\w+)", line)
            if head:
                current = (number, head.group(1))
            elif re.match(r"\S", line):
                current = None  # module level: not inside a test
            if current and current[1] not in seen and pattern.search(line):
                seen.add(current[1])
                found.append(Place(_relative(str(path)), current[0], current[1]))
    return found


def check_origin(check_id: str, tests_dir: Path | None = None) -> CheckOrigin:
    c = check(check_id)
    functions = [s.function() for s in c.steps]
    results = [cls for cls in map(_result_class, functions) if cls is not None]
    tests_dir = tests_dir or REPO / "tests"
    words = [check_id] + [f.__name__ for f in functions]
    return CheckOrigin(c.id, c.notebook, tuple(s.name for s in c.steps), tuple(map(_place, functions)),
                       tuple(dict.fromkeys(map(_place, results))),
                       tuple(_tests_naming(words, tests_dir)) if tests_dir.is_dir() else ())
