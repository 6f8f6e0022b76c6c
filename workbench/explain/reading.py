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
import re
from collections.abc import Iterable, Iterator
from typing import IO

from workbench.explain.metrics import LogMetrics

BLOCK_CHARS = 1 << 22  # 4 M characters a block
CONTEXT_LINES = 200  # lines kept before a hit: its traceback, DataParallel's "Original Traceback" included
AFTER_LINES = 12  # lines kept after a hit (a message that goes on, the next frames of a chained exception)

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][AB012]")
RANK_PREFIX = re.compile(r"^(?:\s*\[(?:rank|default|node)?\d+\]:\s?)+", re.MULTILINE)
FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>[^\s]+)')
# IPython / Jupyter: "File ~/…/site-packages/…/modeling_llama.py:1190, in LlamaForCausalLM.forward(self, …)", the
# failing line marked "--> 1190"
IPYTHON_FRAME = re.compile(r'^\s*File (?P<path>[^\s"]+?):(?P<line>\d+)(?:, in (?P<function>[\w.<>]+))?')
IPYTHON_CODE = re.compile(r'^\s*-+>\s*\d*\s*(?P<code>.*)$')
LOG_RECORD = re.compile(r"""\{\s*['"](?:loss|train_loss|eval_loss|grad_norm|learning_rate)['"]\s*:[^{}]*\}""")
LOG_FIELD = re.compile(r"""['"](?P<key>loss|grad_norm|learning_rate|eval_loss)['"]\s*:\s*(?P<value>nan|-?inf(?:inity)?|[-+]?\d[\d.eE+-]*|tensor\([^)]*\))""",
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
    count: int = 1  # how many lines showed the same symptom
    last_line: int = 0  # the line of its last occurrence

    @property
    def block(self) -> str:
        return "\n".join((*self.before, self.line, *self.after))

    @property
    def frames(self) -> list[Frame]:
        """The traceback's frames up to the error line (what is printed after it is another exception's)."""
        lines = [*self.before, self.line]
        frames: list[Frame] = []
        for i, text in enumerate(lines):
            m = FRAME.match(text)
            if m:
                code = lines[i + 1].strip() if i + 1 < len(lines) and not FRAME.match(lines[i + 1]) else ""
                frames.append(Frame(m["path"].replace("\\", "/"), int(m["line"]), m["function"], code))
                continue
            m = IPYTHON_FRAME.match(text)
            if m:
                code = next((c["code"].strip() for c in (IPYTHON_CODE.match(x) for x in lines[i + 1:i + 12]) if c),
                            "")
                frames.append(Frame(m["path"].replace("\\", "/"), int(m["line"]), m["function"] or "?", code))
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
            fields["script"] = own[0].path
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
class Reading:
    hits: list[Hit]
    metrics: LogMetrics
    versions: dict[str, str]
    lines: int
    characters: int
    clues_seen: dict[str, str] = dataclasses.field(default_factory=dict)  # text-clue pattern -> a line showing it

    def hit(self, symptom_id: str) -> Hit | None:
        return next((h for h in self.hits if h.symptom_id == symptom_id), None)


def clean(text: str) -> str:
    """ANSI colours, torchrun's rank prefixes and carriage returns (progress bars) out."""
    text = ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return RANK_PREFIX.sub("", text)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
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


class _Gate:
    """A regex with the literals one of which any match must contain: blocks are searched for the literals at C
    speed, and the regex runs only on the lines that hold one (a 100 MB log costs a few scans, not a regex per line
    or a case-insensitive alternation over every character)."""

    def __init__(self, key: str, pattern: str | re.Pattern[str]) -> None:
        self.key = key
        self.pattern = pattern if isinstance(pattern, str) else pattern.pattern
        self._regex = None if isinstance(pattern, str) else pattern
        self.literals = _literals(self.pattern)

    @property
    def regex(self) -> re.Pattern[str]:
        """Compiled on first use: most clue gates never find their literal in a text."""
        if self._regex is None:
            self._regex = re.compile(self.pattern, re.IGNORECASE)
        return self._regex

    @property
    def literal(self) -> str:
        return self.literals[0] if self.literals and len(self.literals) == 1 else ""

    def lines(self, text: str, lower: str) -> Iterator[tuple[int, int, re.Match[str]]]:
        """(line start, line end, match) of each line of `text` the regex matches, in order."""
        if not self.literals:
            for m in self.regex.finditer(text):
                start = text.rfind("\n", 0, m.start()) + 1
                end = text.find("\n", m.start())
                end = len(text) if end < 0 else end
                line_match = self.regex.search(text, start, end)
                if line_match:
                    yield start, end, line_match
            return
        starts: set[int] = set()
        for literal in self.literals:
            pos = lower.find(literal)
            while pos >= 0:
                start = text.rfind("\n", 0, pos) + 1
                starts.add(start)
                end = text.find("\n", pos)
                if end < 0:
                    break
                pos = lower.find(literal, max(end, pos + 1))
        for start in sorted(starts):
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            m = self.regex.search(text, start, end)
            if m:
                yield start, end, m


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class `[...]` that starts at `i` (`[]…]` and `[^]…]` included)."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _branches(pattern: str) -> list[str]:
    """The pattern split at its top-level `|` (escapes, classes and groups respected)."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    out.append(pattern[start:])
    return out


def _literals(pattern: str) -> list[str]:
    """One required literal per top-level alternative (lowercased), or [] when some alternative has none: then
    every line is a candidate."""
    branches = _branches(pattern)
    found = [_literal(b, shortest=2 if len(branches) > 1 else 4) for b in branches]
    return found if all(found) else []


def _literal(pattern: str, shortest: int = 4) -> str:
    """The longest run of plain characters outside any group that every match of `pattern` contains ('' when the
    pattern has a top-level alternation or no run of `shortest` characters): the gate of `_Gate`."""
    runs, current, depth, i = [], "", 0, 0

    def end_run() -> None:
        nonlocal current
        if depth == 0:
            runs.append(current)
        current = ""

    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if depth == 0 and nxt in ".^$*+?()[]{}|\\/-'\"`:,=!<>#&%@~; ":
                current += nxt
                if i + 2 < len(pattern) and pattern[i + 2] in "*?{":
                    current = current[:-1]
            else:
                end_run()
            i += 2
            continue
        if c == "|" and depth == 0:
            return ""
        if c == "[":
            end_run()
            i = _class_end(pattern, i)
            continue
        if c == "(":
            end_run()
            depth += 1
            i += 1
            continue
        if c == ")":
            end_run()
            depth -= 1
            i += 1
            continue
        if c in ".^$+":
            end_run()
            i += 1
            continue
        if c in "*?{":  # the character before is optional or repeated: not part of a required run
            current = current[:-1]
            end_run()
            if c == "{":
                j = pattern.find("}", i)
                i = j + 1 if j > 0 else len(pattern)
            else:
                i += 1
            continue
        if depth == 0:
            current += c
        i += 1
    end_run()
    best = max(runs, key=len) if runs else ""
    return best.lower() if len(best.strip()) >= shortest else ""


@dataclasses.dataclass
class _State:
    gates: list[_Gate]
    clue_gates: list[_Gate]
    hits: dict[str, Hit] = dataclasses.field(default_factory=dict)
    metrics: LogMetrics = dataclasses.field(default_factory=LogMetrics)  # noqa: RUF009 - a fresh one per reading
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    clues_seen: dict[str, str] = dataclasses.field(default_factory=dict)  # text-clue pattern -> the first line
    tail: list[str] = dataclasses.field(default_factory=list)  # the last CONTEXT_LINES lines read
    pending: list[Hit] = dataclasses.field(default_factory=list)  # hits still collecting the lines after them
    lines: int = 0
    blocks: int = 0
    last_hit_line: int = 0  # the line of the latest hit of any symptom
    last_block: tuple[str, str] = ("", "")  # the last block read, and its lowercase: its clues are read at the end


def read_text(source: str | IO[str] | IO[bytes] | Iterable[str], symptoms) -> Reading:
    """Stream `source` once: the symptom hits with their context, the logged metrics, the stated versions, and
    which `text` clues of the symptoms' causes appear in the head or the tail of the text (a command line, the
    arguments or `transformers env` at the top of a long log; the last lines printed). Around each hit the clues
    are read in its own block of lines (`Hit.block`)."""
    gates = [_Gate(s.id, r) for s in symptoms for r in s.regexes]
    clue_patterns = dict.fromkeys(c.pattern for s in symptoms for cause in s.causes for c in cause.clues
                                  if c.place == "text")
    clue_gates = [_Gate(p, p) for p in clue_patterns]
    state = _State(gates, clue_gates)
    characters = 0
    carry = ""
    first_block = True
    for raw in _blocks(source):
        characters += len(raw)
        text = carry + raw
        if first_block:
            history = _state_json(text) if isinstance(source, str) or len(raw) < BLOCK_CHARS else None
            if history is not None:
                for record in history:
                    state.metrics.add(record)
            first_block = False
        cut = text.rfind("\n")
        if cut < 0:
            carry = text
            continue
        carry, text = text[cut + 1:], text[:cut]
        _scan(clean(text), state)
    if carry:
        _scan(clean(carry), state)
    if state.blocks > 1:  # the tail of a long log: what was printed last, beside the error
        _scan_clues(*state.last_block, state)
    order = sorted(state.hits.values(), key=lambda h: h.line_number)
    reading = Reading(order, state.metrics, state.versions, state.lines, characters)
    reading.clues_seen = state.clues_seen
    return reading


def _lower(text: str) -> str:
    """text.lower() with every position kept: a character whose lowercase is longer ('İ' -> 'i̇') stays as it is,
    so positions found in the lowercase text are positions in the text."""
    lower = text.lower()
    if len(lower) == len(text):
        return lower
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in text)


def _scan_clues(text: str, lower: str, state: _State) -> None:
    """The head and the tail of the text: `text` clues seen anywhere there, and the versions it states."""
    for m in (m for pattern in VERSION_LINES for m in pattern.finditer(text)):
        name = PACKAGE_NAMES.get(m["pkg"].lower())
        if name:
            state.versions.setdefault(name, m["version"].split("+")[0])
    for gate in state.clue_gates:
        if gate.key not in state.clues_seen:
            for start, end, _m in gate.lines(text, lower):
                state.clues_seen[gate.key] = text[start:end].strip()[:300]
                break


def _scan(text: str, state: _State) -> None:
    """One cleaned block: hits (with the lines before them, from this block and the previous ones), log records,
    versions, text clues."""
    lower = _lower(text)
    lines = text.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    import bisect

    def index(pos: int) -> int:
        return bisect.bisect_right(starts, pos) - 1

    for hit in state.pending:
        hit.after.extend(lines[:AFTER_LINES - len(hit.after)])
    state.pending = [h for h in state.pending if len(h.after) < AFTER_LINES]
    found: list[tuple[int, str, re.Match[str]]] = []
    for gate in state.gates:
        for start, _end, m in gate.lines(text, lower):
            found.append((index(start), gate.key, m))
    for i, key, m in sorted(found, key=lambda f: f[0]):
        number = state.lines + i + 1
        hit = state.hits.get(key)
        previous, state.last_hit_line = state.last_hit_line, max(state.last_hit_line, number)
        if hit is not None:
            if number != hit.last_line:
                hit.count += 1
                hit.last_line = number
            continue
        before = lines[max(0, i - CONTEXT_LINES):i]
        if len(before) < CONTEXT_LINES:
            before = state.tail[len(state.tail) - (CONTEXT_LINES - len(before)):] + before if state.tail else before
        if previous and previous < number:  # the lines since the previous hit: an earlier error's frames stay out
            before = before[len(before) - min(len(before), number - 1 - previous):]
        hit = Hit(key, lines[i].strip(), number, {k: v for k, v in m.groupdict().items() if v}, before,
                  lines[i + 1:i + 1 + AFTER_LINES], last_line=number)
        state.hits[key] = hit
        if len(hit.after) < AFTER_LINES:
            state.pending.append(hit)
    if state.blocks == 0:  # the head of a log: the command line, the arguments, `transformers env`
        _scan_clues(text, lower, state)
    state.last_block = (text, lower)
    state.blocks += 1
    for m in LOG_RECORD.finditer(text):
        state.metrics.add(_record(m.group(0)))
    state.tail = (state.tail + lines)[-CONTEXT_LINES:]
    state.lines += len(lines)


def read_path(path: str) -> Reading:
    """A file (or `-`: standard input), streamed."""
    import sys

    from workbench.explain.symptoms import load_symptoms

    if path == "-":
        return read_text(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"), load_symptoms())
    with open(path, "rb") as fh:
        return read_text(fh, load_symptoms())
