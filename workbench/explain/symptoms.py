"""The symptoms `workbench explain` recognises, kept as data: `workbench/explain/symptoms/*.yaml`, one file per area.

A symptom is a text users paste — an exception message, a warning, a pattern of logged metrics — and the causes
known to produce it, each with the clues in the pasted text that make it more or less likely, the checks of our
catalog that confirm it or rule it out on the user's model, the fix, and the upstream threads where users met it.

Schema of one entry (validated by `load_symptoms`; an invalid file raises `SymptomDataError` naming the entry):

    - id: dtype.linear_operands            # area.name, unique
      title: matmul operands in two dtypes # a short line for --list
      kind: error                          # error (an exception), warning (a logged warning), log (logged metrics)
      message: "expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16"  # as users see it
      patterns:                            # Python regexes, case-insensitive, searched in each line once ANSI colours
        - 'expected mat1 and mat2 to have the same dtype, but got: (?P<dtype_a>\S+) != (?P<dtype_b>\S+)'
                                           # and `[rank1]:` prefixes are stripped; named groups feed `fix`
      when: loss_zero_grad_nan             # kind log only: a condition on the logged metrics that shows it
                                           # (`workbench.explain.metrics.LOG_CONDITIONS`); patterns then optional
      raised_by:                           # the library code that raises or prints it
        - {library: torch, where: "torch.nn.functional.linear (addmm)", releases: ">=2.0"}
      causes:                              # most common first
        - id: dataparallel_replica         # unique within the symptom
          cause: one sentence: what is wrong and why it produces this text
          prior: 0.4                       # its share among this symptom's causes when the text says nothing more
          clues:                           # evidence in the text; each raises (weight > 0) or lowers (< 0) it
            - {in: frames, pattern: 'torch/nn/parallel/data_parallel\.py', weight: 3, says: "…"}
          checks: [parallel.trainer_wrap]  # catalog checks that confirm it (their fail/warn) or rule it out (pass)
          confirms: [fail, warn]           # optional: the verdicts that confirm (default fail, warn; info only where
                                           # the check's info names this cause; never pass, skip or error)
          confirms_if: {parallel.trainer_wrap: 'wraps .* nn\.DataParallel'}   # optional: for a check whose
                                           # verdict has several meanings, what its title or detail must say
          fix: "text; {module}, {family}, {script}, {dtype_a}… are filled from the pasted text"
          sources: [https://github.com/huggingface/transformers/issues/…]   # where users reported it
      sources: [...]                       # threads about the symptom as a whole (optional)

Clue places (`in`): `frames` (the traceback's file paths and function names, one per line `path:function`),
`code` (the source lines the traceback shows), `module` (the module path the failing line calls, e.g. `lm_head`),
`text` (the whole pasted block around the match), `version` (a PEP 440 requirement such as `transformers>=4.46,<4.48`
checked against versions the text states, e.g. from `transformers env`), `metrics` (a condition on logged Trainer
metrics, see `workbench.explain.metrics.LOG_CONDITIONS`).

This module imports no torch: `workbench explain` of a text runs in well under half a second.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).with_name("symptoms")
KINDS = ("error", "warning", "log")
CLUE_PLACES = ("frames", "code", "module", "text", "version", "metrics")
DEFAULT_CONFIRMS = ("fail", "warn")
CONFIRMING = ("fail", "warn", "info")  # info only where the check's info verdict names the cause itself
FIX_FIELDS = ("module", "family", "script", "library", "function")  # filled by reading; plus the named groups


class SymptomDataError(ValueError):
    """A symptoms file that breaks the schema: the file, the entry and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Clue:
    place: str
    pattern: str
    weight: float
    says: str

    @functools.cached_property
    def regex(self) -> re.Pattern[str] | None:
        return None if self.place in ("version", "metrics") else re.compile(self.pattern, re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Cause:
    id: str
    cause: str
    prior: float
    clues: tuple[Clue, ...]
    checks: tuple[str, ...]
    confirms: tuple[str, ...]
    confirms_if: dict[str, str]  # check -> regex its finding's title or detail must match to confirm this cause
    fix: str
    sources: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Symptom:
    id: str
    title: str
    kind: str
    message: str
    patterns: tuple[str, ...]
    when: str | None
    raised_by: tuple[dict[str, str], ...]
    causes: tuple[Cause, ...]
    sources: tuple[str, ...]
    file: str

    @functools.cached_property
    def regexes(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p, re.IGNORECASE) for p in self.patterns)

    @property
    def all_sources(self) -> tuple[str, ...]:
        seen = dict.fromkeys((*self.sources, *(s for c in self.causes for s in c.sources)))
        return tuple(seen)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "kind": self.kind, "message": self.message,
                "patterns": list(self.patterns), "raised_by": list(self.raised_by),
                "causes": [{"id": c.id, "cause": c.cause, "prior": c.prior, "checks": list(c.checks),
                            "fix": c.fix, "sources": list(c.sources)} for c in self.causes],
                "sources": list(self.all_sources)}


def _fail(file: str, entry: str, why: str) -> SymptomDataError:
    return SymptomDataError(f"{file}: {entry}: {why}")


def _strings(value: Any, file: str, entry: str, field: str, *, required: bool = True) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise _fail(file, entry, f"{field} must be a non-empty list of strings")
    return tuple(value)


def _text(entry_data: dict, key: str, file: str, entry: str) -> str:
    value = entry_data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _fail(file, entry, f"{key} must be a non-empty string")
    return value.strip()


def _clue(data: Any, file: str, entry: str) -> Clue:
    if not isinstance(data, dict) or set(data) - {"in", "pattern", "weight", "says"}:
        raise _fail(file, entry, f"a clue has the keys in, pattern, weight, says: {data!r}")
    place = data.get("in")
    if place not in CLUE_PLACES:
        raise _fail(file, entry, f"clue place {place!r} is not one of {', '.join(CLUE_PLACES)}")
    weight = data.get("weight")
    if not isinstance(weight, (int, float)) or weight == 0 or abs(weight) > 10:
        raise _fail(file, entry, f"clue weight {weight!r}: a non-zero number between -10 and 10")
    clue = Clue(place, _text(data, "pattern", file, entry), float(weight), _text(data, "says", file, entry))
    if place == "metrics":
        from workbench.explain.metrics import LOG_CONDITIONS

        if clue.pattern not in LOG_CONDITIONS:
            raise _fail(file, entry, f"metrics clue {clue.pattern!r}: one of {', '.join(LOG_CONDITIONS)}")
    return clue


def check_clue_patterns(symptoms: tuple[Symptom, ...]) -> None:
    """Compile every clue's regex and parse every version requirement, naming the entry of a bad one. Loading does
    not (a few hundred regexes are a third of a second; an explanation compiles only the ones it reads): the tests
    and `workbench explain --list` do."""
    from packaging.requirements import InvalidRequirement, Requirement

    for s in symptoms:
        for cause in s.causes:
            for clue in cause.clues:
                try:
                    if clue.place == "version":
                        Requirement(clue.pattern)
                    else:
                        clue.regex  # noqa: B018 - compiled here so that a bad pattern names its entry
                except (re.error, InvalidRequirement) as exc:
                    raise _fail(s.file, f"{s.id} / {cause.id}", f"{clue.place} clue {clue.pattern!r}: {exc}") \
                        from None


def _cause(data: Any, file: str, symptom: str, group_names: set[str]) -> Cause:
    from workbench.catalog import CHECK_IDS

    if not isinstance(data, dict):
        raise _fail(file, symptom, f"a cause must be a mapping: {data!r}")
    known = {"id", "cause", "prior", "clues", "checks", "confirms", "confirms_if", "fix", "sources"}
    if set(data) - known:
        raise _fail(file, symptom, f"cause keys {sorted(set(data) - known)} unknown; use {sorted(known)}")
    entry = f"{symptom} / {data.get('id')}"
    if not isinstance(data.get("id"), str) or not re.fullmatch(r"[a-z0-9_]+", data["id"]):
        raise _fail(file, entry, "cause id: lowercase letters, digits and _")
    prior = data.get("prior")
    if not isinstance(prior, (int, float)) or not 0 < prior <= 1:
        raise _fail(file, entry, f"prior {prior!r}: a number in (0, 1]")
    checks = tuple(data.get("checks") or ())
    unknown = [c for c in checks if c not in CHECK_IDS]
    if unknown:
        raise _fail(file, entry, f"checks {unknown} are not in the catalog (python -m workbench checks)")
    confirms = tuple(data.get("confirms") or DEFAULT_CONFIRMS)
    if set(confirms) - set(CONFIRMING):
        # pass is a check's healthy answer, skip and error are no answer: none of them confirms a cause. info does
        # only where the check's info names the cause (tokenizer.vocab: "the adapter saves resized embeddings")
        raise _fail(file, entry, f"confirms {list(confirms)}: only {', '.join(CONFIRMING)} confirm a cause")
    confirms_if = dict(data.get("confirms_if") or {})
    if set(confirms_if) - set(checks):
        raise _fail(file, entry, f"confirms_if names {sorted(set(confirms_if) - set(checks))}, not among its checks")
    for pattern in confirms_if.values():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _fail(file, entry, f"confirms_if pattern {pattern!r}: {exc}") from None
    fix = _text(data, "fix", file, entry)
    fields = set(re.findall(r"(?<!\{)\{(\w+)\}(?!\})", fix + " " + _text(data, "cause", file, entry)))
    if fields - set(FIX_FIELDS) - group_names:
        raise _fail(file, entry, f"fix names {sorted(fields - set(FIX_FIELDS) - group_names)}: neither a reading "
                                 f"field ({', '.join(FIX_FIELDS)}) nor a named group of the symptom's patterns")
    return Cause(data["id"], _text(data, "cause", file, entry), float(prior),
                 tuple(_clue(c, file, entry) for c in data.get("clues") or ()), checks, confirms, confirms_if, fix,
                 _strings(data.get("sources"), file, entry, "sources", required=False))


def _symptom(data: Any, file: str) -> Symptom:
    if not isinstance(data, dict):
        raise _fail(file, "?", f"an entry must be a mapping: {data!r}")
    known = {"id", "title", "kind", "message", "patterns", "when", "raised_by", "causes", "sources"}
    sid = data.get("id")
    if not isinstance(sid, str) or not re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+", sid):
        raise _fail(file, repr(sid), "id: area.name, lowercase letters, digits and _")
    if set(data) - known:
        raise _fail(file, sid, f"keys {sorted(set(data) - known)} unknown; use {sorted(known)}")
    if data.get("kind") not in KINDS:
        raise _fail(file, sid, f"kind {data.get('kind')!r}: one of {', '.join(KINDS)}")
    when = data.get("when")
    if when is not None:
        from workbench.explain.metrics import LOG_CONDITIONS

        if data["kind"] != "log" or when not in LOG_CONDITIONS:
            raise _fail(file, sid, f"when {when!r}: only for kind log, one of {', '.join(LOG_CONDITIONS)}")
    patterns = _strings(data.get("patterns"), file, sid, "patterns", required=when is None)
    groups: set[str] = set()
    for p in patterns:
        try:
            groups |= set(re.compile(p, re.IGNORECASE).groupindex)
        except re.error as exc:
            raise _fail(file, sid, f"pattern {p!r}: {exc}") from None
    raised_by = data.get("raised_by")
    if not isinstance(raised_by, list) or not raised_by or not all(
            isinstance(r, dict) and isinstance(r.get("library"), str) for r in raised_by):
        raise _fail(file, sid, "raised_by: a list of {library, where, releases}")
    causes_data = data.get("causes")
    if not isinstance(causes_data, list) or not causes_data:
        raise _fail(file, sid, "causes: a non-empty list")
    causes = tuple(_cause(c, file, sid, groups) for c in causes_data)
    ids = [c.id for c in causes]
    if len(set(ids)) != len(ids):
        raise _fail(file, sid, f"cause ids repeat: {ids}")
    symptom = Symptom(sid, _text(data, "title", file, sid), data["kind"], _text(data, "message", file, sid),
                      patterns, when, tuple(dict(r) for r in raised_by), causes,
                      _strings(data.get("sources"), file, sid, "sources", required=False), file)
    if not symptom.all_sources:
        raise _fail(file, sid, "no source: cite the upstream thread(s) where users reported it")
    if patterns and not any(r.search(symptom.message) for r in symptom.regexes):
        raise _fail(file, sid, "no pattern matches the symptom's own message")
    return symptom


@functools.cache
def load_symptoms(data_dir: Path = DATA_DIR) -> tuple[Symptom, ...]:
    """Every symptom of every file in `data_dir`, validated; ids unique across files."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    symptoms: list[Symptom] = []
    for path in sorted(data_dir.glob("*.yaml")):
        entries = yaml.load(path.read_text(), Loader=loader) or []  # noqa: S506 - a safe loader
        if not isinstance(entries, list):
            raise SymptomDataError(f"{path.name}: a list of symptoms expected")
        symptoms.extend(_symptom(e, path.name) for e in entries)
    ids = [s.id for s in symptoms]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise SymptomDataError(f"symptom ids repeat across files: {repeated}")
    return tuple(symptoms)


def symptom(symptom_id: str) -> Symptom:
    for s in load_symptoms():
        if s.id == symptom_id:
            return s
    raise KeyError(symptom_id)
