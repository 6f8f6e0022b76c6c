"""The token view: a few rows as the model sees them, supervised tokens and masked ones in two colours.

Special tokens are boxed and shown by name; newlines show as ↵. Hovering a token shows its id and label. Rows:
the first healthy ones, and the first row of each defect the statistics found (labelled with it). The same HTML
renders in JupyterLab and in the exported report.
"""

from __future__ import annotations

import dataclasses

from workbench.display.nodes import Node, esc
from workbench.display.result import ProbeResult
from workbench.probes.data.batches import IGNORE, Row

SUPERVISED = "#c8e6c9"  # green
MASKED = "#e0e0e0"  # grey
MAX_TOKENS = 400


@dataclasses.dataclass(repr=False)
class TokenView(ProbeResult):
    rows: list[tuple[str, Row]]
    tokens: dict[int, list[str]]  # row index -> its tokens as text
    specials: frozenset[int]
    message: str = ""

    def details(self):
        from workbench.display.nodes import Bold, Display, Paragraph
        from workbench.probes.data.stats import CATEGORIES

        if not self.rows:
            return Display(Paragraph(self.message or "No row to show."))
        blocks = [TokenLegend()]
        for why, row in self.rows:
            labels = row.labels or [IGNORE] * len(row.ids)
            caption = "healthy" if why == "healthy" else CATEGORIES.get(why, why)
            dropped = " · trl drops this row (nothing supervised after truncation)" if row.labels is None else ""
            supervised = sum(1 for label in labels if label != IGNORE)
            blocks.append(Paragraph(Bold(f"row {row.index}"), f" · {caption} · {len(row.ids)} tokens (of "
                                    f"{row.full_length}), {supervised} supervised{dropped}"))
            blocks.append(TokenStrip(row.ids, labels, self.tokens[row.index], self.specials))
        return Display(*blocks)


class TokenLegend(Node):
    def html(self) -> str:
        return (f"<p><span style='background:{SUPERVISED};padding:0 4px'>supervised</span> "
                f"<span style='background:{MASKED};padding:0 4px;color:#616161'>masked (-100)</span> "
                "<span style='border:1px solid #1565c0;padding:0 3px;font-weight:600'>special token</span>"
                " · hover a token for its id and label</p>")

    def text(self) -> str:
        return "[supervised tokens in brackets], masked ones bare, special tokens as <name>"


class TokenStrip(Node):
    """One row's tokens: coloured spans in HTML (id and label on hover), brackets around supervised ones in text."""

    def __init__(self, ids: list[int], labels: list[int], texts: list[str], specials: frozenset[int]) -> None:
        self.tokens = list(zip(ids, labels, texts))[:MAX_TOKENS]
        self._specials = specials
        self.more = len(ids) - MAX_TOKENS if len(ids) > MAX_TOKENS else 0

    def html(self) -> str:
        spans = []
        for token_id, label, text, special in self._tokens():
            colour = SUPERVISED if label != IGNORE else MASKED
            style = f"background:{colour};" + ("border:1px solid #1565c0;font-weight:600;" if special else "")
            shown = esc(text) if special else esc(text).replace("\n", "↵\n")
            spans.append(f"<span title='id {token_id} · label {label}' style='{style}'>{shown}</span>")
        more = f" … ({self.more} more tokens)" if self.more else ""
        return ("<div class='wb-token-row' style='font-family:monospace;white-space:pre-wrap;line-height:1.7;"
                f"border:1px solid #ddd;padding:4px'>{''.join(spans)}{esc(more)}</div>")

    def text(self) -> str:
        out = []
        for _, label, text, special in self._tokens():
            shown = text if special else text.replace("\n", "↵")
            out.append(f"[{shown}]" if label != IGNORE else shown)
        return "".join(out) + (f" … ({self.more} more tokens)" if self.more else "")

    def _tokens(self):
        return [(i, label, text, i in self._specials) for i, label, text in self.tokens]


def token_view_probe(path, stats) -> TokenView:
    """The rows the statistics kept: healthy ones first, then the first row of each defect."""
    from workbench.probes.data.batches import special_ids
    from workbench.probes.data.stats import SKIP_MESSAGE, Skipped

    if isinstance(stats, Skipped):
        return TokenView([], {}, frozenset(), SKIP_MESSAGE)
    tokenizer = path.tokenizer
    rows = sorted(stats.token_rows, key=lambda item: item[0] != "healthy")
    tokens = {}
    for _, row in rows:
        pieces = tokenizer.convert_ids_to_tokens(row.ids[:MAX_TOKENS])
        specials = special_ids(tokenizer)
        tokens[row.index] = [p if i in specials else tokenizer.convert_tokens_to_string([p])
                             for i, p in zip(row.ids, pieces)]
    return TokenView(rows, tokens, frozenset(special_ids(tokenizer)))
