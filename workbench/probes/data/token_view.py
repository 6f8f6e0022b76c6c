"""The token view: a few rows as the model sees them, supervised tokens and masked ones in two colours.

Special tokens are boxed and shown by name; newlines show as ↵. Hovering a token shows its id and label. Rows:
the first healthy ones, and the first row of each defect the statistics found (labelled with it). The same HTML
renders in JupyterLab and in the exported report.
"""

from __future__ import annotations

import dataclasses

from workbench.probes.data.batches import IGNORE, Row
from workbench.report.text import TextRepr

SUPERVISED = "#c8e6c9"  # green
MASKED = "#e0e0e0"  # grey
MAX_TOKENS = 400


@dataclasses.dataclass(repr=False)
class TokenView(TextRepr):
    rows: list[tuple[str, Row]]
    tokens: dict[int, list[str]]  # row index -> its tokens as text
    specials: frozenset[int]
    message: str = ""

    def _repr_html_(self) -> str:
        from workbench.report.html import esc
        from workbench.probes.data.stats import CATEGORIES

        if not self.rows:
            return f"<p>{esc(self.message or 'No row to show.')}</p>"
        legend = (f"<p><span style='background:{SUPERVISED};padding:0 4px'>supervised</span> "
                  f"<span style='background:{MASKED};padding:0 4px;color:#616161'>masked (-100)</span> "
                  "<span style='border:1px solid #1565c0;padding:0 3px;font-weight:600'>special token</span>"
                  " · hover a token for its id and label</p>")
        blocks = []
        for why, row in self.rows:
            labels = row.labels or [IGNORE] * len(row.ids)
            texts = self.tokens[row.index]
            spans = []
            for token_id, label, text in list(zip(row.ids, labels, texts))[:MAX_TOKENS]:
                colour = SUPERVISED if label != IGNORE else MASKED
                special = token_id in self.specials
                style = f"background:{colour};" + ("border:1px solid #1565c0;font-weight:600;" if special else "")
                shown = esc(text).replace("\n", "↵\n") if not special else esc(text)
                spans.append(f"<span title='id {token_id} · label {label}' style='{style}'>{shown}</span>")
            more = f" … ({len(row.ids) - MAX_TOKENS} more tokens)" if len(row.ids) > MAX_TOKENS else ""
            caption = "healthy" if why == "healthy" else CATEGORIES.get(why, why)
            dropped = " · trl drops this row (nothing supervised after truncation)" if row.labels is None else ""
            supervised = sum(1 for label in labels if label != IGNORE)
            blocks.append(f"<div class='wb-token-row'><b>row {row.index}</b> · {esc(caption)} · {len(row.ids)} "
                          f"tokens (of {row.full_length}), {supervised} supervised{dropped}"
                          f"<div style='font-family:monospace;white-space:pre-wrap;line-height:1.7;"
                          f"border:1px solid #ddd;padding:4px'>{''.join(spans)}{esc(more)}</div></div>")
        return legend + "".join(blocks)


def token_view_probe(path, stats) -> TokenView:
    """The rows the statistics kept: healthy ones first, then the first row of each defect."""
    from workbench.probes.data.batches import special_ids
    from workbench.probes.data.stats import SKIP_MESSAGE, Skipped

    if isinstance(stats, Skipped):
        return TokenView([], {}, frozenset(), SKIP_MESSAGE)
    tokenizer = path.tokenizer
    rows = sorted(stats.view, key=lambda item: item[0] != "healthy")
    tokens = {}
    for _, row in rows:
        pieces = tokenizer.convert_ids_to_tokens(row.ids[:MAX_TOKENS])
        specials = special_ids(tokenizer)
        tokens[row.index] = [p if i in specials else tokenizer.convert_tokens_to_string([p])
                             for i, p in zip(row.ids, pieces)]
    return TokenView(rows, tokens, frozenset(special_ids(tokenizer)))
