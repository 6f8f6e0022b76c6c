"""The display model: a result describes itself once, as blocks, and both of its views come from those blocks.

A result's `view()` returns a `Display`; its HTML (JupyterLab, the exported report) and its text (terminals, logs,
`print`) both come from that one render (`workbench.display.result`), the pattern of rich.

    >>> d = Display(Heading("Census"), Table(["dtype", "n"], [["bf16", 3]]))
    >>> print(d.text())
    Census
    <BLANKLINE>
    dtype  n
    -----  -
    bf16   3

Every string is escaped in HTML (tensor names, paths and config values come from checkpoints nobody vetted),
except the markup of a `Figure`, which our own code draws (escaping what it labels). What HTML folds under
`Details` (evidence, tracebacks, long tables) stays out of the text view; a figure shows in text as its alternative.
"""

from __future__ import annotations

import html as _html
import math
import numbers
import re
from typing import Any, Callable, Iterable, Sequence, Union

from workbench.display.text import MAX_CELL, format_table

VERDICT_COLOURS = {
    "error": "#7b1fa2", "fail": "#c62828", "warn": "#ef6c00",
    "info": "#1565c0", "skip": "#757575", "pass": "#2e7d32",
}


def esc(value: Any) -> str:
    return _html.escape(str(value))


def squash(text: str) -> str:
    """Whitespace as a browser shows it: runs collapse to one space."""
    return re.sub(r"\s+", " ", text).strip()


def cell_text(value: Any) -> str:
    """A table value as text: missing values blank, floats to six significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        shown = f"{float(value):.6g}"
        return f"{float(value):.0f}" if "e+" in shown else shown
    return str(value)


class Node:
    """Anything shown: `html()` for the notebook, `text()` for the terminal."""

    def html(self) -> str:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError


Part = Union[str, int, float, Node, None]  # a plain value is text, escaped in HTML


def parts_html(parts: Iterable[Part]) -> str:
    return "".join(p.html() if isinstance(p, Node) else esc(cell_text(p)) for p in parts)


def parts_text(parts: Iterable[Part]) -> str:
    return "".join(p.text() if isinstance(p, Node) else cell_text(p) for p in parts)


class Inline(Node):
    """Parts in a row; the subclasses wrap them in a tag: `Code("x")` is <code>x</code>, `Line` a <div>."""

    tag = ""

    def __init__(self, *parts: Part) -> None:
        self.parts = parts

    def html(self) -> str:
        inner = parts_html(self.parts)
        return f"<{self.tag}>{inner}</{self.tag}>" if self.tag else inner

    def text(self) -> str:
        return parts_text(self.parts)


class Code(Inline):
    tag = "code"


class Bold(Inline):
    tag = "b"


class Italic(Inline):
    tag = "i"


class Line(Inline):
    """A line of its own inside a cell; in text, a space apart from its neighbours."""

    tag = "div"

    def text(self) -> str:
        return f" {parts_text(self.parts)} "


class Link(Inline):
    def __init__(self, href: str, *parts: Part) -> None:
        super().__init__(*parts)
        self.href = href

    def html(self) -> str:
        return f'<a href="{esc(self.href)}">{parts_html(self.parts)}</a>'


class Badge(Node):
    """A verdict as a coloured label (colours from `VERDICT_COLOURS`); in text, the verdict in capitals."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict

    def html(self) -> str:
        colour = VERDICT_COLOURS.get(self.verdict, "#000")
        return (f'<span style="background:{colour};color:#fff;border-radius:3px;padding:1px 6px;'
                f'font-weight:600;font-size:0.85em">{esc(self.verdict.upper())}</span>')

    def text(self) -> str:
        return self.verdict.upper()


class Heading(Inline):
    def __init__(self, *parts: Part, level: int = 4) -> None:
        super().__init__(*parts)
        self.tag = f"h{level}"

    def text(self) -> str:
        return squash(parts_text(self.parts))


class Paragraph(Inline):
    tag = "p"

    def text(self) -> str:
        return squash(parts_text(self.parts))


class Bullets(Node):
    def __init__(self, items: Iterable[Part]) -> None:
        self.items = list(items)

    def html(self) -> str:
        return "<ul>" + "".join(f"<li>{parts_html([item])}</li>" for item in self.items) + "</ul>" if self.items else ""

    def text(self) -> str:
        return "\n".join(f"- {squash(parts_text([item]))}" for item in self.items)


class Pre(Node):
    def __init__(self, content: str) -> None:
        self.content = content

    def html(self) -> str:
        return f"<pre>{esc(self.content)}</pre>"

    def text(self) -> str:
        return self.content


class Details(Node):
    """Folded in HTML (one click away); left out of the text view, which stays a summary."""

    def __init__(self, summary: str, *blocks: Node) -> None:
        self.summary, self.blocks = summary, blocks

    def html(self) -> str:
        return f"<details><summary>{esc(self.summary)}</summary>{blocks_html(self.blocks)}</details>"

    def text(self) -> str:
        return ""


class Figure(Node):
    """A drawing our code made (an SVG, or a function that draws a PNG), shown in text as its alternative."""

    def __init__(self, markup: str | Callable[[], str], alt: str) -> None:
        self.markup, self.alt = markup, alt

    def html(self) -> str:
        return self.markup() if callable(self.markup) else self.markup

    def text(self) -> str:
        return f"[figure: {self.alt}]" if self.alt else ""


class Box(Node):
    """Blocks in a box with a coloured left border (e.g. a step that could not run)."""

    def __init__(self, colour: str, background: str, *blocks: Node) -> None:
        self.colour, self.background, self.blocks = colour, background, blocks

    def html(self) -> str:
        return (f'<div style="border-left:4px solid {esc(self.colour)};padding:4px 8px;background:'
                f'{esc(self.background)}">{blocks_html(self.blocks)}</div>')

    def text(self) -> str:
        return blocks_text(self.blocks)


class Cell(Node):
    """A table cell with a background colour or an alignment of its own."""

    def __init__(self, value: Part, background: str | None = None, align: str | None = None) -> None:
        self.value, self.background, self.align = value, background, align

    def style(self) -> str:
        rules = [f"background:{self.background}" if self.background else "",
                 f"text-align:{self.align}" if self.align else ""]
        return ";".join(r for r in rules if r)

    def html(self) -> str:
        return parts_html([self.value])

    def text(self) -> str:
        return parts_text([self.value])


class Table(Node):
    """The one table helper: every HTML table and every text table of a result comes from here.

    `columns=None` is a table without a header row; `row_headers` shows each row's first cell as a header
    (key-value tables, grids); `left` left-aligns every cell (JupyterLab right-aligns them; prose reads left).
    In text: aligned columns, or one `column value` record per row when that is too wide (see `format_table`).
    """

    def __init__(self, columns: Sequence[str] | None, rows: Iterable[Sequence[Part]], *, css_class: str = "wb-table",
                 row_headers: bool = False, left: bool = False) -> None:
        self.columns = list(columns) if columns is not None else None
        self.rows = [list(r) for r in rows]
        self.css_class, self.row_headers, self.left = css_class, row_headers, left

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], columns: Sequence[str] | None = None,
                     **options: Any) -> Table:
        """Dicts as rows; the columns are every key in first-seen order unless given; missing values are blank."""
        records = list(records)
        if columns is None:
            columns = list(dict.fromkeys(k for r in records for k in r))
        return cls(columns, ([r.get(c) for c in columns] for r in records), **options)

    @classmethod
    def from_frame(cls, frame, **options: Any) -> Table:
        """A pandas DataFrame, without its index."""
        return cls.from_records(frame.to_dict("records"), [str(c) for c in frame.columns], **options)

    def _cell_html(self, tag: str, value: Part) -> str:
        style = "text-align:left" if self.left else ""
        if isinstance(value, Cell) and value.style():
            style = ";".join(s for s in (style, value.style()) if s)
        attribute = f' style="{esc(style)}"' if style else ""
        return f"<{tag}{attribute}>{parts_html([value])}</{tag}>"

    def html(self) -> str:
        if not self.rows and not self.columns:
            return ""
        css = f' class="{esc(self.css_class)}"' if self.css_class else ""
        head = ("<thead><tr>" + "".join(self._cell_html("th", c) for c in self.columns) + "</tr></thead>"
                if self.columns is not None else "")
        body = "".join("<tr>" + "".join(self._cell_html("th" if self.row_headers and i == 0 else "td", value)
                                        for i, value in enumerate(row)) + "</tr>" for row in self.rows)
        return f"<table{css}>{head}<tbody>{body}</tbody></table>"

    def text(self) -> str:
        def shown(value: Part) -> str:
            text = squash(parts_text([value]))
            return text if len(text) <= MAX_CELL else text[:MAX_CELL - 1] + "…"

        rows = [[shown(v) for v in row] for row in self.rows]
        if self.columns is None:
            return format_table(rows, header=False)
        return format_table([[shown(c) for c in self.columns]] + rows)


def facts_table(rows: Iterable[tuple[str, Any]]) -> Table | None:
    """Facts as a two-column table, names in the first column, values as code; empty values left out."""
    facts = [[name, Code(str(value))] for name, value in rows if value not in (None, [], {})]
    return Table(None, facts, row_headers=True, left=True) if facts else None


def blocks_html(blocks: Iterable[Node | None]) -> str:
    return "".join(b.html() for b in blocks if b is not None)


def blocks_text(blocks: Iterable[Node | None]) -> str:
    return "\n\n".join(t for b in blocks if b is not None and (t := b.text().strip("\n")).strip())


class Display(Node):
    """What a result shows: its blocks in order (`None` entries are skipped, for blocks shown only sometimes)."""

    def __init__(self, *blocks: Node | Display | None) -> None:
        self.blocks: list[Node] = []
        for block in blocks:
            if isinstance(block, Display):
                self.blocks.extend(block.blocks)
            elif block is not None:
                self.blocks.append(block)

    def html(self) -> str:
        return blocks_html(self.blocks)

    def text(self) -> str:
        return blocks_text(self.blocks)
