"""From a reading of the pasted text to the symptom it shows and its causes, ranked by the clues the text holds.

    explanation = explain_text(open("crash.log"))        # or a string
    explanation.symptom, explanation.causes[0].cause, explanation.causes[0].why

The symptom is the last exception the text raised (the one that ended the run); warnings and logged-metric
symptoms lead only when no exception is present, and the others are listed under `also`. Each cause scores its
prior plus the weights of its clues that the text shows; `why` says which clues matched, in the data's words.
Unknown text gets the nearest symptoms by shared words, never a guess of a cause.
"""

from __future__ import annotations

import dataclasses
import re
from typing import IO, Any, Iterable

from workbench.display.result import Displayable
from workbench.explain.reading import Hit, Reading, read_text
from workbench.explain.symptoms import Cause, Clue, Symptom, load_symptoms

KIND_ORDER = {"error": 0, "warning": 1, "log": 2}


@dataclasses.dataclass
class RankedCause:
    symptom: Symptom
    cause: Cause
    score: float
    why: list[str]
    fix: str
    confirmed: bool | None = None  # set by confirmation on the user's model (workbench.explain.confirm)
    evidence: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause.cause, "id": f"{self.symptom.id}/{self.cause.id}", "score": round(self.score, 2),
                "why": self.why, "checks": list(self.cause.checks), "confirmed": self.confirmed,
                "evidence": self.evidence, "fix": self.fix, "sources": list(self.cause.sources or
                                                                            self.symptom.all_sources)}


@dataclasses.dataclass
class Seen:
    """A symptom the text shows, with the hit (None for a logged-metric symptom) and the fields its fix uses."""

    symptom: Symptom
    hit: Hit | None

    def as_dict(self, reading: Reading) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.symptom.id, "title": self.symptom.title, "kind": self.symptom.kind,
                             "raised_by": list(self.symptom.raised_by)}
        if self.hit is not None:
            fields = self.hit.fields()
            frames = self.hit.frames
            d.update({"message": self.hit.line, "line": self.hit.line_number, "times": self.hit.count,
                      "module": fields["module"] or None, "family": fields["family"] or None,
                      "library": fields["library"] or None, "function": fields["function"] or None,
                      "script": fields["script"] or None,
                      "frames": [str(f) for f in frames[-8:]]})
        else:
            d.update({"message": self.symptom.message, "metrics": reading.metrics.summary()})
        return d


@dataclasses.dataclass(repr=False)
class Explanation(Displayable):
    reading: Reading
    seen: Seen | None
    causes: list[RankedCause]
    also: list[Seen]
    nearest: list[tuple[Symptom, float]]
    confirmation: dict[str, Any] | None = None  # what `--ckpt` ran (workbench.explain.confirm)
    reproduction: dict[str, Any] | None = None  # what `--reproduce` replayed (workbench.explain.reproduce)

    def view(self):
        from workbench.explain.view import explanation_view

        return explanation_view(self)

    def __repr__(self) -> str:
        lead = self.causes[0].cause.id if self.causes else None
        return f"<Explanation {self.symptom.id if self.symptom else 'no known symptom'}: {lead}>"

    @property
    def symptom(self) -> Symptom | None:
        return self.seen.symptom if self.seen else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "symptom": self.seen.as_dict(self.reading) if self.seen else None,
            "causes": [c.as_dict() for c in self.causes],
            "also": [{"id": s.symptom.id, "title": s.symptom.title,
                      "message": s.hit.line if s.hit else s.symptom.message,
                      "line": s.hit.line_number if s.hit else None} for s in self.also],
            "versions": self.reading.versions,
            "read": {"lines": self.reading.lines, "characters": self.reading.characters},
        }
        if self.seen is None:
            out["nearest"] = [{"id": s.id, "title": s.title, "message": s.message, "similarity": round(score, 2)}
                              for s, score in self.nearest]
        if self.confirmation is not None:
            out["confirmation"] = self.confirmation
        if self.reproduction is not None:
            out["reproduction"] = {k: v for k, v in self.reproduction.items() if k != "text"}
        return out


def _clue_matches(clue: Clue, hit: Hit | None, reading: Reading) -> str | None:
    """What in the text matched the clue (a frame, a line), or None."""
    if clue.place == "metrics":
        return f"the logged metrics show {clue.pattern}" if reading.metrics.holds(clue.pattern) else None
    if clue.place == "version":
        from packaging.requirements import Requirement

        req = Requirement(clue.pattern)
        stated = reading.versions.get(req.name.lower())
        if stated and req.specifier.contains(stated, prereleases=True):
            return f"{req.name} {stated}"
        return None
    if clue.place == "text":
        if hit is not None:
            m = clue.regex.search(hit.block)
            if m:
                return _line_of(hit.block, m)
        return reading.clues_seen.get(clue.pattern)
    if hit is None:
        return None
    if clue.place == "frames":
        for frame in hit.frames:
            if clue.regex.search(f"{frame.path}:{frame.function}"):
                return str(frame)
        return None
    if clue.place == "code":
        for frame in hit.frames:
            if frame.code and clue.regex.search(frame.code):
                return frame.code
        return None
    module = hit.fields()["module"]
    return module if module and clue.regex.search(module) else None


def _line_of(text: str, m: re.Match[str]) -> str:
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start:end if end >= 0 else len(text)].strip()[:200]


FIELD = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")


def fill_fix(fix: str, fields: dict[str, str]) -> str:
    """`{module}`-style fields filled from the text; a field the text did not give stays visible as `<module>`.
    Other braces (a dict literal such as `{"use_reentrant": False}`) are left as they are."""
    return FIELD.sub(lambda m: fields.get(m.group(1)) or f"<{m.group(1)}>", fix)


def rank_causes(symptom: Symptom, hit: Hit | None, reading: Reading) -> list[RankedCause]:
    fields = hit.fields() if hit is not None else {}
    ranked = []
    for cause in symptom.causes:
        score, why = cause.prior, []
        for clue in cause.clues:
            seen = _clue_matches(clue, hit, reading)
            if seen is not None:
                score += clue.weight
                why.append(f"{'+' if clue.weight > 0 else '−'} {clue.says} ({seen})")
        if not why:
            why.append("the text shows no clue for or against it: ranked by how often it is the cause")
        ranked.append(RankedCause(symptom, dataclasses.replace(cause, cause=fill_fix(cause.cause, fields)), score, why,
                                  fill_fix(cause.fix, fields)))
    return sorted(ranked, key=lambda c: (-c.score, -c.cause.prior))


def _seen(reading: Reading, symptoms: Iterable[Symptom]) -> list[Seen]:
    by_id = {s.id: s for s in symptoms}
    seen = [Seen(by_id[h.symptom_id], h) for h in reading.hits]
    hit_ids = {s.symptom.id for s in seen}
    seen += [Seen(s, None) for s in by_id.values()
             if s.when and s.id not in hit_ids and reading.metrics.holds(s.when)]
    # the exception that ended the run leads: errors before warnings before logged metrics, the latest first
    return sorted(seen, key=lambda s: (KIND_ORDER[s.symptom.kind], -(s.hit.last_line if s.hit else 0)))


WORD = re.compile(r"[a-z][a-z_]{2,}")


def nearest_symptoms(text: str, symptoms: Iterable[Symptom], n: int = 3) -> list[tuple[Symptom, float]]:
    """The symptoms whose messages share the most words with the text (Jaccard on words of 3+ letters)."""
    words = set(WORD.findall(text.lower()[-20000:]))
    if not words:
        return []
    scored = []
    for s in symptoms:
        theirs = set(WORD.findall(f"{s.message} {s.title}".lower()))
        if theirs:
            scored.append((s, len(words & theirs) / len(theirs)))
    scored.sort(key=lambda x: -x[1])
    return [(s, score) for s, score in scored[:n] if score > 0]


def explain_reading(reading: Reading, symptoms: tuple[Symptom, ...] | None = None, *,
                    tail: str = "") -> Explanation:
    symptoms = symptoms or load_symptoms()
    seen = _seen(reading, symptoms)
    if not seen:
        return Explanation(reading, None, [], [], nearest_symptoms(tail, symptoms))
    lead = seen[0]
    return Explanation(reading, lead, rank_causes(lead.symptom, lead.hit, reading), seen[1:], [])


def explain_text(source: str | IO[str] | IO[bytes]) -> Explanation:
    """The explanation of a text (a string or a file object, streamed)."""
    symptoms = load_symptoms()
    if isinstance(source, str):
        return explain_reading(read_text(source, symptoms), symptoms, tail=source[-20000:])
    tail = _Tail(source)
    reading = read_text(tail, symptoms)
    return explain_reading(reading, symptoms, tail=tail.text)


class _Tail:
    """A file object that remembers the last characters read (for the nearest symptoms of an unknown text)."""

    def __init__(self, source: IO[Any], keep: int = 20000) -> None:
        self.source, self.keep, self.text = source, keep, ""

    def read(self, size: int = -1) -> str:
        chunk = self.source.read(size)
        if isinstance(chunk, bytes):
            chunk = chunk.decode("utf-8", "replace")
        self.text = (self.text + chunk)[-self.keep:]
        return chunk
