"""`data.template`: BOS doubled, render-then-encode against apply_chat_template(tokenize=True), special tokens in
the raw text.

A chat template that renders `{{ bos_token }}` composes badly with a tokenizer that adds BOS itself: render the
text (`tokenize=False`), encode it (`tokenizer(text)`) and the row starts with BOS twice (transformers #37686).
trl's own path for `messages` rows tokenizes inside apply_chat_template and is safe; rows stored already rendered
(`text`) and scripts that render then encode are not. The whole-dataset pass counts the batched rows that start
with BOS twice (a `fail`: the run trains on it); here the two encodings are compared on the first conversational
rows (a `warn`: a trap for any code that renders then encodes, inference included), and the rows' own text (as
written, before trl's preparation appends the EOS text to a completion) is read for special tokens written into it
(a user message holding `<|im_end|>` ends the turn early).
A tokenizer with no BOS at all cannot double it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.probes.data.stats import DataStatistics, Skipped, has_special_text

COMPARED_ROWS = 64  # conversational rows whose two encodings are compared
SCANNED_ROWS = 100_000  # raw rows scanned for special tokens when the batches do not carry the text


@dataclasses.dataclass(repr=False)
class TemplateResult(ProbeResult):
    stats: DataStatistics
    bos: str | None
    compared: int = 0
    differing: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # {row, first_difference, …}
    doubled_by_encode: int = 0
    special_rows: list[int] = dataclasses.field(default_factory=list)
    special_count: int = 0
    scanned: int = 0

    def findings(self) -> list[Finding]:
        doubled = self.stats.categories["doubled_bos"]
        special = self.stats.categories["special_in_text"]
        special_count = special.count + self.special_count
        special_rows = (special.rows + self.special_rows)[:20]
        evidence = {"bos_token": self.bos, "batched_rows_with_bos_twice": {"count": doubled.count,
                                                                           "rows": doubled.rows},
                    "compared_rows": self.compared, "render_then_encode_differs": self.differing[:10],
                    "special_tokens_in_text": {"count": special_count, "rows": special_rows},
                    "special_tokens": list(self.stats.special_strings)}
        if doubled.count:
            return [Finding("data.template", "fail", f"BOS doubled in {doubled.count:,} batched row(s)",
                            f"{doubled.count:,} of {self.stats.rows:,} rows start with {self.bos} twice: rows "
                            f"{doubled.named()}. The rows were rendered with the template's BOS and the tokenizer "
                            "added its own when encoding them (transformers #37686).", evidence,
                            "Store messages and let apply_chat_template(tokenize=True) tokenize them, or encode "
                            "rendered text with add_special_tokens=False (or drop {{ bos_token }} from the text).")]
        problems = []
        if self.differing:
            what = ("the tokenizer adds BOS to a text whose template already starts with it"
                    if self.doubled_by_encode else "the ids differ")
            problems.append(f"render-then-encode (apply_chat_template(tokenize=False), then tokenizer(text)) "
                            f"differs from apply_chat_template(tokenize=True) in {len(self.differing)} of "
                            f"{self.compared} rows: {what} (first at row {self.differing[0]['row']}, position "
                            f"{self.differing[0]['position']}); the batches themselves are unaffected: none of "
                            f"the {self.stats.batched:,} batched rows starts with BOS twice")
        if special_count:
            problems.append(f"{special_count:,} row(s) write a special token ({', '.join(self.stats.special_strings)})"
                            f" into their raw text: rows {', '.join(map(str, special_rows))}")
        if problems:
            fixes = []
            if self.differing:
                fixes.append("Your batches are not affected where trl tokenizes messages itself; any code that "
                             "renders then encodes (inference included) must pass add_special_tokens=False.")
            if special_count:
                name = self.stats.path.source.path.name if self.stats.path.source is not None else "the data"
                fixes.append(f"Strip or escape the special-token strings in the text of rows "
                             f"{', '.join(map(str, special_rows))} of {name} (the text as written, before any "
                             "EOS trl appends).")
            return [Finding("data.template", "warn", "Template and tokenizer disagree on some rows"
                            if self.differing else "Special tokens in the raw text", "; ".join(problems) + ".",
                            evidence, " ".join(fixes))]
        no_bos = "The tokenizer has no BOS token: nothing to double. " if self.bos is None else ""
        compared = (f"render-then-encode equals apply_chat_template(tokenize=True) on {self.compared} rows"
                    if self.compared else "no conversational row to render (nothing to compare)")
        return [Finding("data.template", "pass", "Template, tokenizer and text agree",
                        f"{no_bos}No batched row starts with BOS twice; {compared}; no special token in the text.",
                        evidence)]

    def details(self):
        from workbench.display.nodes import Code, Display, Table

        rows = [[d["row"], d["position"], Code(str(d["template"])), Code(str(d["encoded"]))]
                for d in self.differing[:5]]
        return Display(Table(
            ["row", "first differing position", "apply_chat_template(tokenize=True)", "tokenizer(rendered text)"],
            rows) if rows else None)


def template_probe(path, stats):
    """Template checks on the first conversational rows, plus the whole-dataset counts of the statistics."""
    if isinstance(stats, Skipped) or path.how == "none":
        return Skipped(("data.template",))
    from workbench.probes.data.batches import common_prefix_length

    tokenizer = path.tokenizer
    result = TemplateResult(stats, getattr(tokenizer, "bos_token", None))
    source = path.source
    if source is not None and source.conversational and getattr(tokenizer, "chat_template", None):
        for index, row in enumerate(source.rows(COMPARED_ROWS)):
            messages = row.get("messages") or (row["prompt"] + row["completion"])
            rendered = tokenizer.apply_chat_template(messages, tokenize=False)
            template_ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
            encoded = list(tokenizer(rendered)["input_ids"])
            result.compared += 1
            if template_ids != encoded:
                at = common_prefix_length(template_ids, encoded)
                bos = tokenizer.bos_token_id
                if bos is not None and encoded[:2] == [bos, bos]:
                    result.doubled_by_encode += 1
                result.differing.append({"row": index, "position": at,
                                         "template": tokenizer.convert_ids_to_tokens(template_ids[at:at + 4]),
                                         "encoded": tokenizer.convert_ids_to_tokens(encoded[at:at + 4])})
    if path.how == "trainer" and source is not None and stats.special_strings:
        for index, row in enumerate(source.rows(min(path.samples or SCANNED_ROWS, SCANNED_ROWS))):
            result.scanned += 1
            if has_special_text(row, stats.special_strings):
                result.special_count += 1
                if len(result.special_rows) < 20:
                    result.special_rows.append(index)
    return result
