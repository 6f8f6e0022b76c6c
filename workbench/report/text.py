"""Plain-text rendering of result objects: the same content as their HTML, for terminals, logs and `print`.

Every probe result renders three ways from one source: `_repr_html_` in JupyterLab and the exported report, and
`repr()` / `str()` as text derived from that HTML (headings, paragraphs, list items, tables as aligned columns),
so the text view can never drift from what the notebook shows.

    >>> html_to_text("<h3>Census</h3><table><tr><th>dtype</th><th>n</th></tr><tr><td>bf16</td><td>3</td></tr></table>")
    'Census\\n\\ndtype  n\\n-----  -\\nbf16   3'
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "pre", "summary", "br", "tr", "table", "details"}
SKIPPED = {"style", "script", "svg"}  # drawings carry their content in words beside them
MAX_CELL = 300
MAX_TABLE_WIDTH = 140  # wider tables print as one block of "column: value" lines per row


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.line: list[str] = []
        self.tables: list[list[list[str]]] = []  # a stack: tables may nest
        self.cell: list[str] | None = None
        self.skipping = 0
        self.in_pre = 0

    def _flush(self) -> None:
        text = "".join(self.line)
        text = text if self.in_pre else re.sub(r"\s+", " ", text).strip()
        if text:
            self.out.append(text)
        self.line = []

    def handle_starttag(self, tag, attrs):
        if tag in SKIPPED:
            self.skipping += 1
        elif tag == "table":
            self._flush()
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self.cell = []
        elif tag == "pre":
            self._flush()
            self.in_pre += 1
        elif tag == "li" and self.cell is None:
            self._flush()
            self.line.append("- ")
        elif tag in BLOCKS and self.cell is None:
            self._flush()
        elif tag == "details" and self.cell is not None:
            self.skipping += 1  # evidence folded in a cell stays folded in text (findings.json has it)
        elif tag in BLOCKS and self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag):
        if tag in SKIPPED or (tag == "details" and self.cell is not None):
            self.skipping = max(0, self.skipping - 1)
        elif tag in ("td", "th") and self.tables and self.cell is not None:
            text = re.sub(r"\s+", " ", "".join(self.cell)).strip()
            if self.tables[-1]:
                self.tables[-1][-1].append(text if len(text) <= MAX_CELL else text[:MAX_CELL - 1] + "…")
            self.cell = None
        elif tag == "table" and self.tables:
            rows = [r for r in self.tables.pop() if r]
            self.out.append(format_table(rows))
        elif tag == "pre":
            self._flush()
            self.in_pre = max(0, self.in_pre - 1)
        elif tag in BLOCKS and self.cell is None:
            self._flush()

    def handle_data(self, data):
        if self.skipping:
            return
        if self.cell is not None:
            self.cell.append(data)
        else:
            self.line.append(data)


def format_table(rows: list[list[str]]) -> str:
    """Rows of cells as aligned columns, the first row underlined as the header."""
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    sizes = [max(len(r[i]) for r in rows) for i in range(width)]
    if sum(sizes) + 2 * (width - 1) > MAX_TABLE_WIDTH and len(rows) > 1:
        header, key_width = rows[0], max(len(h) for h in rows[0])
        return "\n\n".join("\n".join(f"{h.ljust(key_width)}  {c}" for h, c in zip(header, r) if c) for r in rows[1:])
    lines = ["  ".join(c.ljust(s) for c, s in zip(r, sizes)).rstrip() for r in rows]
    if len(lines) > 1:
        lines.insert(1, "  ".join("-" * s for s in sizes))
    return "\n".join(lines)


def text_table(columns: list[str], rows: list[dict]) -> str:
    """Records as aligned columns (numbers with thousands separators), e.g. the CLI's census table."""
    def cell(value) -> str:
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)

    return format_table([list(columns)] + [[cell(r.get(c, "")) for c in columns] for r in rows])


def html_to_text(html: str) -> str:
    parser = _TextParser()
    parser.feed(html)
    parser.close()
    parser._flush()
    return "\n\n".join(block for block in parser.out if block.strip())


class TextRepr:
    """Mixin: `repr()` is the text of `_repr_html_` (decorate dataclasses with `repr=False` to keep it)."""

    def __repr__(self) -> str:
        return html_to_text(self._repr_html_())  # type: ignore[attr-defined]
