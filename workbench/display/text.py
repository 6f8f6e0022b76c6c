"""Plain-text tables: what a `Table` node prints as in a result's text view (`print(result)`, terminals, logs).

    >>> print(format_table([["dtype", "n"], ["bf16", "3"]]))
    dtype  n
    -----  -
    bf16   3
"""

from __future__ import annotations

MAX_CELL = 300
MAX_TABLE_WIDTH = 140  # wider tables print as one block of "column value" lines per row


def format_table(rows: list[list[str]], header: bool = True) -> str:
    """Rows of cells as aligned columns, the first row underlined as the header (unless `header=False`)."""
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    sizes = [max(len(r[i]) for r in rows) for i in range(width)]
    if header and sum(sizes) + 2 * (width - 1) > MAX_TABLE_WIDTH and len(rows) > 1:
        names, key_width = rows[0], max(len(h) for h in rows[0])
        return "\n\n".join("\n".join(f"{h.ljust(key_width)}  {c}" for h, c in zip(names, r) if c) for r in rows[1:])
    lines = ["  ".join(c.ljust(s) for c, s in zip(r, sizes)).rstrip() for r in rows]
    if header and len(lines) > 1:
        lines.insert(1, "  ".join("-" * s for s in sizes))
    return "\n".join(lines)


def text_table(columns: list[str], rows: list[dict]) -> str:
    """Records as aligned columns (numbers with thousands separators), e.g. the CLI's census table."""
    def cell(value) -> str:
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)

    return format_table([list(columns)] + [[cell(r.get(c, "")) for c in columns] for r in rows])



def size_text(size: float) -> str:
    """A byte count in the unit that reads best: 3.2 MB, 15.23 GB (decimal units, as the Hub shows sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{int(size)} B"
