"""Reading what a user pasted: a traceback, a log tail or a whole Trainer log, as it comes.

    reading = read_text(open("train.log"), symptoms)     # a file object, streamed; or read_text(str, …)
    reading.hits        # every symptom seen: the line, its traceback frames, the module the failing line calls
    reading.metrics     # the Trainer's logged metrics (loss, grad_norm, learning_rate …), for log symptoms
    reading.versions    # library versions the text states (`transformers env`, pip freeze lines)

Lines are cleaned before matching: ANSI colours, torchrun's `[rank1]:` / `[default0]:` prefixes and carriage
returns (progress bars) are removed. The text is read in blocks, so a 100 MB log costs one pass and bounded memory:
each hit keeps the lines before it (its traceback) up to the previous hit.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any

BLOCK_CHARS = 1 << 22  # 4 M characters a block
CONTEXT_LINES = 200  # lines kept before a hit: its traceback, DataParallel's "Original Traceback" included
AFTER_LINES = 12  # lines kept after a hit (a message that goes on, the next frames of a chained exception)

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][AB012]")
RANK_PREFIX = re.compile(r"^(?:\s*\[(?:rank|default|node)?\d+\]:\s?)+", re.MULTILINE)
FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>[^\s]+)')
LOG_RECORD = re.compile(r"""\{\s*['"](?:loss|train_loss|eval_loss|grad_norm|learning_rate)['"]\s*:[^{}]*\}""")
LOG_FIELD = re.compile(r"""['"](?P<key>[\w/.-]+)['"]\s*:\s*(?P<value>nan|-?inf(?:inity)?|[-+]?\d[\d.eE+-]*|tensor\([^)]*\))""",
                       re.IGNORECASE)
VERSION_LINES = (
    # `transformers env`: "- `transformers` version: 4.46.0"; "- PyTorch version (GPU?): 2.1.0+cu121 (True)"
    re.compile(r"^[-*\s]*`?(?P<pkg>[A-Za-z][\w.-]*)`? version(?: \([^)]*\))?:\s*v?(?P<version>\d+(?:\.\d+)+[\w.+-]*)",
               re.MULTILINE | re.IGNORECASE),
    # pip freeze / requirements: "transformers==4.46.0"
    re.compile(r"^\s*(?P<pkg>[A-Za-z][\w.-]*)\s*==\s*(?P<version>\d+(?:\.\d+)+[\w.+-]*)", re.MULTILINE),
)
PACKAGE_NAMES = {"pytorch": "torch", "torch": "torch", "transformers": "transformers", "peft": "peft", "trl": "trl",
                 "accelerate": "accelerate", "bitsandbytes": "bitsandbytes", "deepspeed": "deepspeed",
                 "vllm": "vllm", "datasets": "datasets", "safetensors": "safetensors", "flash-attn": "flash-attn",
                 "flash_attn": "flash-attn", "python": "python"}


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _loss_zero_grad_nan(m: "LogMetrics") -> bool:
    return any(loss == 0.0 and math.isnan(g) for loss, g in m.paired("loss", "grad_norm"))


# Conditions on the Trainer's logged metrics that log symptoms and `metrics` clues name
LOG_CONDITIONS: dict[str, Any] = {
    "loss_zero_grad_nan": _loss_zero_grad_nan,  # a logged loss of exactly 0.0 where grad_norm is nan
    "loss_nan": lambda m: any(math.isnan(v) for v in m.series.get("loss", [])),
    "grad_norm_nan": lambda m: any(math.isnan(v) for v in m.series.get("grad_norm", [])),
    "eval_loss_nan": lambda m: any(math.isnan(v) for v in m.series.get("eval_loss", [])),
    # two or more logged losses of exactly 0.0 in a row, with finite gradient norms where they are logged
    "loss_zero": lambda m: m.zero_run("loss") >= 2 and not _loss_zero_grad_nan(m),
    "grad_norm_zero": lambda m: m.zero_run("grad_norm") >= 2,
    "learning_rate_zero": lambda m: bool(m.series.get("learning_rate")) and all(
        v == 0.0 for v in m.series["learning_rate"]),
    # the first logged loss far above ln(vocab) of any tokenizer: a sum where a mean is expected
    "loss_above_chance": lambda m: bool(_finite(m.series.get("loss", []))) and _finite(m.series["loss"])[0] > 25.0,
    "loss_flat": lambda m: len(_finite(m.series.get("loss", []))) >= 5 and (
        max(_finite(m.series["loss"])) - min(_finite(m.series["loss"]))) <= 1e-3 * max(
        1.0, abs(_finite(m.series["loss"])[0])),
}


@dataclasses.dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str
    code: str = ""

    @property
    def library(self) -> str | None:
        """The installed package the frame is in (`torch`, `transformers` …), None for the user's own code."""
        m = re.search(r"(?:site|dist)-packages/([A-Za-z_][\w]*)", self.path)
        return m.group(1) if m else None

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}"


@dataclasses.dataclass
class Hit:
    """One line that matched a symptom, with the traceback and lines around it."""

    symptom_id: str
    line: str
    line_number: int  # 1-based, in the cleaned text
    groups: dict[str, str]
    before: list[str]
    after: list[str] = dataclasses.field(default_factory=list)
    count: int = 1  # how many times the same symptom was seen

    @property
    def block(self) -> str:
        return "\n".join((*self.before, self.line, *self.after))

    @property
    def frames(self) -> list[Frame]:
        lines = [*self.before, self.line, *self.after]
        frames: list[Frame] = []
        for i, text in enumerate(lines):
            m = FRAME.match(text)
            if m:
                code = lines[i + 1].strip() if i + 1 < len(lines) and not FRAME.match(lines[i + 1]) else ""
                frames.append(Frame(m["path"], int(m["line"]), m["function"], code))
        return frames

    def fields(self) -> dict[str, str]:
        """What the fix templates name: the module the failing line calls, the model family, the user's script, the
        library and function that raised, and the pattern's named groups."""
        frames = self.frames
        fields = {"module": "", "family": "", "script": "", "library": "", "function": ""}
        for frame in reversed(frames):  # innermost first: the module a model/user line calls
            m = re.search(r"self\.([A-Za-z_][\w.]*)\s*\(", frame.code)
            if m and (frame.library is None or "/models/" in frame.path or frame.library == "peft"):
                fields["module"] = m.group(1)
                break
        for frame in frames:
            m = re.search(r"/models/([\w]+)/modeling_", frame.path)
            if m:
                fields["family"] = m.group(1)
        own = [f for f in frames if f.library is None and not f.path.startswith("<")]
        if own:
            fields["script"] = f"{own[0].path}:{own[0].line}"
        inner = next((f for f in reversed(frames) if f.library), None)
        if inner:
            fields["library"], fields["function"] = inner.library, inner.function
        if not fields["module"]:
            m = re.search(r"(?:module|layer)[\s`'\"]+([A-Za-z_][\w]*(?:\.[\w]+)+)", self.block)
            if m:
                fields["module"] = m.group(1)
        fields.update({k: v for k, v in self.groups.items() if v})
        return fields


@dataclasses.dataclass
class LogMetrics:
    """The Trainer's logged records (`{'loss': …, 'grad_norm': …}` lines, or trainer_state.json's log_history)."""

    records: list[dict[str, float]] = dataclasses.field(default_factory=list)

    @property
    def series(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for r in self.records:
            for k, v in r.items():
                out.setdefault(k, []).append(v)
        return out

    def paired(self, a: str, b: str) -> list[tuple[float, float]]:
        return [(r[a], r[b]) for r in self.records if a in r and b in r]

    def zero_run(self, key: str) -> int:
        best = run = 0
        for v in self.series.get(key, []):
            run = run + 1 if v == 0.0 else 0
            best = max(best, run)
        return best

    def holds(self, condition: str) -> bool:
        return bool(self.records) and bool(LOG_CONDITIONS[condition](self))

    def summary(self) -> dict[str, Any]:
        s = self.series
        return {"records": len(self.records),
                **{k: {"first": v[0], "last": v[-1], "nan": sum(math.isnan(x) for x in v),
                       "zero": sum(x == 0.0 for x in v)} for k, v in s.items()
                   if k in ("loss", "grad_norm", "learning_rate", "eval_loss")}}


@dataclasses.dataclass
class Reading:
    hits: list[Hit]
    metrics: LogMetrics
    versions: dict[str, str]
    lines: int
    characters: int

    def hit(self, symptom_id: str) -> Hit | None:
        return next((h for h in self.hits if h.symptom_id == symptom_id), None)


def clean(text: str) -> str:
    """ANSI colours, torchrun's rank prefixes and carriage returns (progress bars) out."""
    text = ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return RANK_PREFIX.sub("", text)


def _number(text: str) -> float | None:
    t = text.lower()
    if t.startswith("tensor("):
        t = t[7:].split(",")[0].rstrip(")").strip()
    try:
        return float(t.replace("infinity", "inf"))
    except ValueError:
        return None


def _record(line: str) -> dict[str, float]:
    out = {}
    for m in LOG_FIELD.finditer(line):
        value = _number(m["value"])
        if value is not None:
            out[m["key"]] = value
    return out


def _blocks(source: str | IO[str] | IO[bytes] | Iterable[str]) -> Iterator[str]:
    if isinstance(source, str):
        yield source
        return
    read = getattr(source, "read", None)
    if read is None:
        yield from source
        return
    while True:
        chunk = read(BLOCK_CHARS)
        if not chunk:
            return
        yield chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk


def _state_json(text: str) -> list[dict[str, float]] | None:
    """trainer_state.json pasted or given as the file: its log_history."""
    if not text.lstrip().startswith("{") or '"log_history"' not in text:
        return None
    try:
        state = json.loads(text)
    except ValueError:
        return None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        return None
    return [{k: float(v) for k, v in r.items() if isinstance(v, (int, float))} for r in history if isinstance(r, dict)]


class _Matcher:
    """Every symptom's patterns, tried on the lines that contain one of their literal words (one pass a block)."""

    def __init__(self, symptoms) -> None:
        self.rules = [(s.id, r) for s in symptoms for r in s.regexes]
        # a cheap gate: a line is tried only if it holds a long literal run of some pattern (case-folded)
        self.gates = [(_literal(r.pattern), sid, r) for sid, r in self.rules]

    def match(self, line: str) -> list[tuple[str, re.Match[str]]]:
        folded = line.lower()
        found, seen = [], set()
        for literal, sid, regex in self.gates:
            if sid in seen or (literal and literal not in folded):
                continue
            m = regex.search(line)
            if m:
                found.append((sid, m))
                seen.add(sid)
        return found


def _literal(pattern: str) -> str:
    """The longest run of plain characters in a regex that any match must contain ('' when unsure)."""
    if "|" in pattern.replace(r"\|", ""):
        return ""  # an alternation: no single literal is required
    runs, current, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in ".^$*+?()[]{}|\\/-'\"`:,=!<>#&%@~; ":
                current += nxt
                i += 2
                continue
            runs.append(current)
            current = ""
            i += 2
            continue
        if c in ".^$*+?()[]{}|":
            # a quantifier makes the character before it optional
            if c in "*?{" and current:
                current = current[:-1]
            runs.append(current)
            current = ""
            if c == "[":
                j = pattern.find("]", i + 2)
                i = j + 1 if j > 0 else len(pattern)
                continue
            if c == "(" and pattern.startswith("(?P<", i):
                i = pattern.find(">", i) + 1
                continue
            if c == "(" and pattern.startswith("(?", i):
                i += 3
                continue
            i += 1
            continue
        current += c
        i += 1
    runs.append(current)
    return max(runs, key=len).lower() if runs else ""


def read_text(source: str | IO[str] | IO[bytes] | Iterable[str], symptoms) -> Reading:
    """Stream `source` once: the symptom hits with their context, the logged metrics, the stated versions."""
    matcher = _Matcher(symptoms)
    hits: dict[str, Hit] = {}
    order: list[Hit] = []
    metrics = LogMetrics()
    versions: dict[str, str] = {}
    window: list[str] = []  # lines since the previous hit (at most CONTEXT_LINES)
    pending: list[Hit] = []  # hits still collecting their lines after
    line_number = characters = 0
    carry = ""
    first_block = True
    for raw in _blocks(source):
        characters += len(raw)
        text = carry + raw
        if first_block:
            history = _state_json(text) if isinstance(source, str) or len(raw) < BLOCK_CHARS else None
            if history is not None:
                metrics.records.extend(r for r in history if r)
            first_block = False
        cut = text.rfind("\n")
        if cut < 0:
            carry = text
            continue
        carry, text = text[cut + 1:], text[:cut]
        line_number = _scan(clean(text), matcher, hits, order, metrics, versions, window, pending, line_number)
    if carry:
        line_number = _scan(clean(carry), matcher, hits, order, metrics, versions, window, pending, line_number)
    return Reading(order, metrics, versions, line_number, characters)


def _scan(text, matcher, hits, order, metrics, versions, window, pending, line_number) -> int:
    for m in (m for pattern in VERSION_LINES for m in pattern.finditer(text)):
        name = PACKAGE_NAMES.get(m["pkg"].lower())
        if name:
            versions[name] = m["version"].split("+")[0]
    for line in text.split("\n"):
        line_number += 1
        for hit in pending:
            hit.after.append(line)
        pending[:] = [h for h in pending if len(h.after) < AFTER_LINES]
        if "{" in line and LOG_RECORD.search(line):
            record = _record(line)
            if record:
                metrics.records.append(record)
        for sid, m in matcher.match(line):
            if sid in hits:
                hits[sid].count += 1
                continue
            hit = Hit(sid, line.strip(), line_number, {k: v for k, v in m.groupdict().items() if v},
                      window[-CONTEXT_LINES:])
            hits[sid] = hit
            order.append(hit)
            pending.append(hit)
        window.append(line)
        if len(window) > 2 * CONTEXT_LINES:
            del window[:CONTEXT_LINES]
    return line_number


def read_path(path: str) -> Reading:
    """A file (or `-`: standard input), streamed."""
    import sys

    from workbench.explain.symptoms import load_symptoms

    if path == "-":
        return read_text(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"), load_symptoms())
    with open(path, "rb") as fh:
        return read_text(fh, load_symptoms())
