"""`data.labels`, `data.eos`, `data.truncation`: every row of the batches, streamed once, counted.

Memory stays flat whatever the dataset's size: per category a count and the first rows' indices, a length
histogram (a Counter of lengths), and a handful of rows kept whole for the token view.

Normal, not defects: with completion-only or assistant-only loss the prompt's labels are -100 by design; padding
is -100 by design (it is removed before counting); a row cut by max_length has no EOS to supervise (it is counted
under truncation, not under EOS). A row whose answer max_length cut away entirely is data.truncation's: data.labels
counts it and says so, but does not judge labels that have no answer to supervise.

A blank answer (an empty or whitespace completion / assistant message) is a defect the masking cannot show: trl
appends EOS, the template closes the turn, and the row supervises the end of turn alone, so the model learns to
answer with EOS (unsloth #2515, OpenRLHF #985).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.probes.data.batches import IGNORE, DataBatches, Row, batch_progress, special_ids
from workbench.probes.data.label_fixes import blank_fix, labels_fix, masking_cause

NAMED = 20  # rows named per category
FAIL_SHARE = 0.01  # answers cut, or rows trl drops as unsupervised, in at least this share of rows: a fail
VIEW_ROWS = 3  # healthy rows kept for the token view, beside the first row of each defect
SKIP_MESSAGE = ("No training data given: pass --data FILE (a JSONL of `messages`, `prompt`/`completion` or `text` "
                "rows, or a datasets.save_to_disk folder); make diagnose DATA=FILE; or data = \"FILE\" in the "
                "notebook's parameters")
CATEGORIES = {
    "nothing_supervised": "every label -100 in the batch (loss 0, or NaN for a batch of such rows)",
    "dropped_unsupervised": "nothing to supervise: trl drops the row before batching",
    "answer_unsupervised": "no token of the answer supervised",
    "blank_answer": "a blank answer: only end-of-turn / EOS and whitespace supervised",
    "prompt_supervised": "prompt tokens supervised although the run means answer-only loss",
    "eos_unsupervised": "the end-of-turn / EOS token is not a supervised label",
    "truncated": "cut by max_length",
    "answer_cut": "the answer cut by max_length (its end, EOS included, never seen)",
    "answer_lost": "the answer lost entirely to max_length",
    "doubled_bos": "starts with BOS twice",
    "special_in_text": "a special token written in the raw text",
}


@dataclasses.dataclass
class Category:
    count: int = 0
    rows: list[int] = dataclasses.field(default_factory=list)

    def add(self, index: int) -> None:
        self.count += 1
        if len(self.rows) < NAMED:
            self.rows.append(index)

    def named(self) -> str:
        more = f" (and {self.count - len(self.rows):,} more)" if self.count > len(self.rows) else ""
        return ", ".join(str(r) for r in self.rows) + more


@dataclasses.dataclass(repr=False)
class DataStatistics(ProbeResult):
    path: DataBatches
    rows: int = 0  # rows read
    batched: int = 0  # rows that reach a batch
    supervised_tokens: int = 0
    tokens: int = 0
    answers_located: int = 0
    eos_eligible: int = 0  # rows in a batch, supervised, not cut: their EOS should be a label
    eos_supervised: int = 0
    dropped_by_truncation: int = 0  # trl drops them: truncation left nothing supervised
    lengths: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    categories: dict[str, Category] = dataclasses.field(
        default_factory=lambda: {name: Category() for name in CATEGORIES})
    token_rows: list[tuple[str, Row]] = dataclasses.field(default_factory=list)  # rows kept for the token view
    special_strings: tuple[str, ...] = ()
    blank_example: dict[str, Any] | None = None  # the first blank answer's supervised ids and tokens
    whitespace_ids: dict[int, bool] = dataclasses.field(default_factory=dict)  # token id -> decodes to whitespace

    # -- the pass ---------------------------------------------------------------------------------------------
    def collect(self) -> DataStatistics:
        path = self.path
        tokenizer = path.tokenizer
        specials = special_ids(tokenizer)
        self.special_strings = tuple(sorted({tokenizer.convert_ids_to_tokens(i) for i in specials} - {None}))
        bos = getattr(tokenizer, "bos_token_id", None)
        stops = path.stop_ids
        meant_answer_only = path.meant_answer_only
        bar = batch_progress(path.total, "rows")
        try:
            for row in path.rows():
                self._count(row, bos, stops, meant_answer_only)
                bar.update(1)
        finally:
            bar.close()
        path.release()  # a Trainer's model is not kept resident after its rows are read
        return self

    def _mark(self, name: str, row: Row) -> None:
        self._marked = True
        category = self.categories[name]
        if not category.count and len(self.token_rows) < VIEW_ROWS + 8:
            self.token_rows.append((name, row))
        category.add(row.index)

    def _count(self, row: Row, bos: int | None, stops: frozenset[int], meant_answer_only: bool | None) -> None:
        self.rows += 1
        self._marked = False
        self.lengths[row.full_length] += 1
        lo, hi = row.window
        cut = row.cut
        ids, labels = row.ids, row.labels
        if cut:
            self._mark("truncated", row)
        if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
            self._mark("doubled_bos", row)
        if row.raw and self.special_strings and has_special_text(row.raw, self.special_strings):
            self._mark("special_in_text", row)
        answer = row.answer_start
        if answer is not None:
            self.answers_located += 1
        # lost to max_length: the cut left no token of the answer (an uncut row with nothing after its answer
        # header is a labels matter, not a length one)
        answer_lost = cut and answer is not None and max(answer, lo) >= hi
        if answer is not None and cut and not answer_lost:
            self._mark("answer_cut", row)
        if labels is None:  # trl drops it
            if row.full_supervised:
                self.dropped_by_truncation += 1
                self._mark("answer_lost", row)
            else:
                self._mark("dropped_unsupervised", row)
            return
        self.batched += 1
        self.tokens += len(ids)
        supervised = [i for i, label in enumerate(labels) if label != IGNORE]
        self.supervised_tokens += len(supervised)
        if answer_lost:  # data.truncation's: the labels cannot be judged on an answer that is not there
            self._mark("answer_lost", row)
            return
        if not supervised:
            self._mark("nothing_supervised", row)
            return
        if answer is not None:
            start = max(answer - lo, 0)
            if not any(i >= start for i in supervised):
                self._mark("answer_unsupervised", row)
            if meant_answer_only and supervised[0] < _first_answer(row, lo):
                self._mark("prompt_supervised", row)
        if not cut:
            answer_ids = [ids[i] for i in supervised if i >= _first_answer(row, lo)]  # no answer located: all
            if answer_ids and all(i in stops or self._whitespace(i) for i in answer_ids):
                if self.blank_example is None:
                    self.blank_example = {"row": row.index, "supervised_answer_ids": answer_ids,
                                          "tokens": self.path.tokenizer.convert_ids_to_tokens(answer_ids)}
                self._mark("blank_answer", row)
            self.eos_eligible += 1
            if any(labels[i] in stops for i in supervised):
                self.eos_supervised += 1
            else:
                self._mark("eos_unsupervised", row)
        if not self._marked and sum(1 for n, _ in self.token_rows if n == "healthy") < VIEW_ROWS:
            self.token_rows.append(("healthy", row))

    def _whitespace(self, token_id: int) -> bool:
        """Whether the token decodes to whitespace alone (cached: a handful of ids recur)."""
        known = self.whitespace_ids.get(token_id)
        if known is None:
            known = self.whitespace_ids[token_id] = not self.path.tokenizer.decode([token_id]).strip()
        return known

    # -- verdicts ---------------------------------------------------------------------------------------------
    def share(self, name: str, of: int | None = None) -> float:
        total = self.rows if of is None else of
        return self.categories[name].count / total if total else 0.0

    def _evidence(self, *names: str) -> dict[str, Any]:
        return {"rows_read": self.rows, "rows_batched": self.batched, "built_by": self.path.how,
                "masking": self.path.masking, **{name: {"count": self.categories[name].count,
                                                        "rows": self.categories[name].rows} for name in names}}

    def _line(self, name: str, of: int | None = None) -> str:
        c = self.categories[name]
        return (f"{c.count:,} of {self.rows if of is None else of:,} rows ({100 * self.share(name, of):.1f} %) "
                f"{CATEGORIES[name]}: rows {c.named()}")

    def _rows_of(self, name: str) -> str:
        """"rows 4, 13 of train.jsonl": a category's rows, in the user's own file (or the Trainer's dataset)."""
        source = self.path.source
        where = ("your Trainer's train_dataset" if self.path.how == "trainer" else
                 source.path.name if source is not None else "your dataset")
        return f"rows {self.categories[name].named()} of {where}"

    def findings(self) -> list[Finding]:
        return [self.labels_finding(), self.eos_finding(), self.truncation_finding()]

    def labels_finding(self) -> Finding:
        c = self.categories
        evidence = self._evidence("nothing_supervised", "dropped_unsupervised", "answer_unsupervised",
                                  "blank_answer", "prompt_supervised", "answer_lost")
        evidence.update(supervised_tokens=self.supervised_tokens, tokens=self.tokens,
                        answers_located=self.answers_located, blank_answer_example=self.blank_example,
                        end_of_turn_ids=sorted(self.path.stop_ids), max_length=self.path.max_length)
        lost = self._lost_note()
        masked = [n for n in ("nothing_supervised", "answer_unsupervised") if c[n].count]
        if self.share("dropped_unsupervised") >= FAIL_SHARE:  # trl drops them silently: the data is still lost
            masked.append("dropped_unsupervised")
        blank_fails = self.share("blank_answer") >= FAIL_SHARE
        if masked or blank_fails:
            titles, lines, fixes = [], [], []
            if masked:
                titles.append(f"{sum(c[n].count for n in masked):,} of {self.rows:,} row(s) train nothing on "
                              "their answer")
                lines.append(" ".join(self._line(n) for n in masked) + ". " + masking_cause(self.path))
                fixes.append(labels_fix(self.path))
            if blank_fails:
                titles.append(f"{c['blank_answer'].count:,} of {self.rows:,} row(s) have a blank answer: the "
                              "model learns to answer with EOS alone")
                lines.append(self._blank_line())
                fixes.append(blank_fix(self.path, c["blank_answer"]))
            return Finding("data.labels", "fail", "; ".join(titles), " ".join(lines) + lost, evidence,
                           " ".join(fixes))
        warnings = [n for n in ("blank_answer", "prompt_supervised", "dropped_unsupervised") if c[n].count]
        if warnings:
            fixes = {"blank_answer": blank_fix(self.path, c["blank_answer"]),
                     "prompt_supervised": "Prompt supervised: give the run answer-only masking "
                     "(SFTConfig(completion_only_loss=True) with prompt/completion rows, or assistant_only_loss=True "
                     "with a template that marks {% generation %}).",
                     "dropped_unsupervised": "Dropped rows: give them an answer, or remove them from the file."}
            title = "; ".join(f"{c[n].count:,} row(s) with a blank answer (only EOS supervised)"
                              if n == "blank_answer" else CATEGORIES[n] for n in warnings)
            return Finding("data.labels", "warn", title,
                           " ".join(self._blank_line() if n == "blank_answer" else self._line(n) + "."
                                    for n in warnings) + lost, evidence, " ".join(fixes[n] for n in warnings))
        share = self.supervised_tokens / self.tokens if self.tokens else 0.0
        kept = self.batched - c["answer_lost"].count + self.dropped_by_truncation  # rows whose answer is batched
        if c["answer_lost"].count:
            whole = (f" The run supervises every token ({self.path.masking}): prompts are trained on by design."
                     if self.path.meant_answer_only is False else "")
            others = (f"Every one of the {kept:,} batched rows that keep their answer supervises it, none blank "
                      f"({self.path.masking})." if kept else "No row keeps its answer.")
            return Finding("data.labels", "info", f"{c['answer_lost'].count:,} of {self.rows:,} row(s) lost their "
                           "answer to max_length (data.truncation's)" + ("; the other rows supervise their answers"
                                                                        if kept else ""),
                           others + whole + lost, evidence)
        if self.path.meant_answer_only is False:
            return Finding("data.labels", "info", f"Whole-sequence loss: {100 * share:.0f} % of tokens supervised",
                           f"The run supervises every token ({self.path.masking}); prompts are trained on by design. "
                           f"Every one of {self.batched:,} rows supervises its answer, none blank.", evidence)
        return Finding("data.labels", "pass", f"Every row supervises its answer ({100 * share:.0f} % of tokens)",
                       f"{self.batched:,} rows, {self.path.masking}: no row without supervised labels, no answer "
                       "left unsupervised, no blank answer.", evidence)


    def _blank_line(self) -> str:
        stops = ", ".join(self.path.tokenizer.convert_ids_to_tokens(i) or str(i) for i in sorted(self.path.stop_ids))
        example = self.blank_example or {}
        seen = (f" (row {example['row']} supervises ids {example['supervised_answer_ids']} = {example['tokens']})"
                if example else "")
        source = self.path.source
        closes = ("the EOS appended to it" if source is not None and not source.conversational
                  and source.format in ("prompt-completion", "text") else "the template's end of turn")
        return (f"{self._line('blank_answer')}. Their answer is empty or whitespace, so all it supervises is "
                f"{closes} ({stops}) and whitespace{seen}. Trained on them, the model learns to answer with EOS "
                "alone: empty replies (unsloth #2515, OpenRLHF #985).")


    def _lost_note(self) -> str:
        """Rows whose answer max_length cut away: counted here, judged by data.truncation."""
        lost = self.categories["answer_lost"]
        if not lost.count:
            return ""
        dropped = (f"; trl drops {self.dropped_by_truncation:,} of them (nothing left to supervise)"
                   if self.dropped_by_truncation else "")
        return (f" {self._line('answer_lost')} (max_length {self.path.max_length}{dropped}): their labels cannot "
                "supervise an answer that is not in the row; data.truncation reports them, and their labels are not "
                "judged here.")

    def eos_finding(self) -> Finding:
        path = self.path
        stops = sorted(path.stop_ids)
        evidence = self._evidence("eos_unsupervised")
        evidence.update(eos_token_id=path.eos_token_id, pad_token_id=path.pad_token_id, end_of_turn_ids=stops,
                        eligible_rows=self.eos_eligible, eos_supervised_rows=self.eos_supervised)
        if not stops:
            return Finding("data.eos", "warn", "The tokenizer has no EOS token", "Nothing tells the model to stop.",
                           evidence, "Set tokenizer.eos_token to the template's end-of-turn token.")
        if not self.eos_eligible:
            return Finding("data.eos", "skip", "No uncut supervised row to look at",
                           "Every batched row is cut by max_length or supervises nothing (see data.truncation and "
                           "data.labels).", evidence)
        share = self.eos_supervised / self.eos_eligible
        pad_is_eos = path.pad_token_id is not None and path.pad_token_id in path.stop_ids
        names = ", ".join(path.tokenizer.convert_ids_to_tokens(i) or str(i) for i in stops)
        if self.eos_supervised == 0:
            cause = (f"pad = EOS (pad_token_id {path.pad_token_id} is the end-of-turn {names}): the collator masks "
                     "padding as -100 by token id, and every EOS with it. The model never learns to stop: endless "
                     "generation (trl #3091, #1623)." if pad_is_eos else
                     f"The end-of-turn token ({names}, ids {stops}) is masked in every row, so the model never "
                     "learns to stop: endless generation.")
            fix = ("Give the tokenizer a pad token distinct from EOS (e.g. tokenizer.pad_token = '<|endoftext|>' or "
                   "an added '<pad>'), or use a collator that masks padding by attention_mask, not by id (trl's "
                   "DataCollatorForLanguageModeling does)." if pad_is_eos else
                   "Keep the end-of-turn inside the supervised span: with assistant_only_loss put it inside "
                   "{% generation %}…{% endgeneration %}; with your own collator do not mask it.")
            return Finding("data.eos", "fail", f"EOS supervised in 0 % of rows ({self.eos_eligible:,} uncut)",
                           cause, evidence, fix)
        if share < 1:
            return Finding("data.eos", "warn", f"EOS supervised in {100 * share:.1f} % of uncut rows",
                           self._line("eos_unsupervised", self.eos_eligible) + ".", evidence,
                           f"Look at {self._rows_of('eos_unsupervised')} in the token view: their end-of-turn "
                           f"({names}) is missing or masked; end every answer with it, as a supervised label.")
        return Finding("data.eos", "pass", f"EOS supervised in every uncut row ({self.eos_supervised:,})",
                       f"End-of-turn {names} (ids {stops}) is a supervised label in every row that reaches a batch "
                       f"whole; pad id {path.pad_token_id}.", evidence)

    def truncation_finding(self) -> Finding:
        path = self.path
        c = self.categories
        lengths = self.length_summary()
        evidence = self._evidence("truncated", "answer_cut", "answer_lost")
        evidence.update(max_length=path.max_length, truncation_mode=path.truncation_mode, lengths=lengths,
                        dropped_by_truncation=self.dropped_by_truncation)
        limit = f"max_length {path.max_length}" if path.max_length is not None else "no max_length"
        fix = (f"Raise max_length above the longest rows you want whole (p99 {lengths.get('p99')}, max "
               f"{lengths.get('max')}), shorten or drop the long rows, or use truncation_mode='keep_end' when only "
               "prompts run long.")
        lost = c["answer_cut"].count + c["answer_lost"].count
        if lost and lost / max(self.rows, 1) >= FAIL_SHARE or c["answer_lost"].count:
            lines = [self._line(n) for n in ("answer_lost", "answer_cut") if c[n].count]
            trl_drop = (f" trl drops the {self.dropped_by_truncation:,} row(s) truncation left with nothing "
                        "supervised: they never reach a batch." if self.dropped_by_truncation else "")
            return Finding("data.truncation", "fail", f"{lost:,} answer(s) cut or lost by {limit}",
                           f"{self._line('truncated')}. " + " ".join(lines) + "." + trl_drop, evidence, fix)
        if c["truncated"].count:
            return Finding("data.truncation", "warn", f"{c['truncated'].count:,} row(s) cut by {limit}",
                           self._line("truncated") + (f"; {lost:,} answer(s) cut" if lost else "; answers intact")
                           + ".", evidence, fix.replace("the long rows", f"the long rows ({self._rows_of('truncated')})"))
        return Finding("data.truncation", "pass", f"No row cut by {limit}",
                       f"Longest row {lengths.get('max')} tokens (p99 {lengths.get('p99')}).", evidence)

    def length_summary(self) -> dict[str, Any]:
        if not self.lengths:
            return {}
        ordered = sorted(self.lengths.items())
        total = sum(self.lengths.values())

        def quantile(q: float) -> int:
            seen = 0
            for length, n in ordered:
                seen += n
                if seen >= q * total:
                    return length
            return ordered[-1][0]

        return {"min": ordered[0][0], "p50": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99),
                "max": ordered[-1][0], "mean": round(sum(k * n for k, n in ordered) / total, 1)}

    # -- display ----------------------------------------------------------------------------------------------
    def draw_lengths(self):
        """The length distribution against max_length (a matplotlib figure)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 2.6))
        values, weights = zip(*sorted(self.lengths.items()))
        ax.hist(values, bins=min(60, max(10, len(values))), weights=weights, color="#5c6bc0")
        if self.path.max_length is not None:
            ax.axvline(self.path.max_length, color="#c62828", linestyle="--", label=f"max_length {self.path.max_length}")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_xlabel("tokens per row (before truncation)")
        ax.set_ylabel("rows")
        fig.tight_layout()
        return fig

    def details(self):
        from workbench.display.findings_view import figure
        from workbench.display.nodes import Cell, Display, Paragraph, Table

        rows = [[CATEGORIES[n], Cell(f"{c.count:,}", align="right"), c.named()]
                for n, c in self.categories.items() if c.count]
        lengths = ", ".join(f"{k} {v}" for k, v in self.length_summary().items())
        return Display(
            Paragraph(f"{self.rows:,} rows read, {self.batched:,} in batches; tokens per row: {lengths}"),
            Table(["rows that…", "count", "rows"], rows) if rows else Paragraph("No row falls in any defect category."),
            figure(self.draw_lengths, "tokens per row against max_length") if self.lengths else None)


def _first_answer(row: Row, lo: int) -> int:
    start = row.answer_start if row.answer_start is not None else 0
    return max((row.prompt_end if row.prompt_end is not None else start) - lo, 0)


def has_special_text(raw: dict[str, Any], specials: tuple[str, ...]) -> bool:
    for key in ("messages", "prompt", "completion"):
        value = raw.get(key)
        texts = ([m.get("content") for m in value if isinstance(m, dict)] if isinstance(value, list)
                 else [value])
        for text in texts:
            if isinstance(text, str) and any(s in text for s in specials):
                return True
    return False


def data_statistics_probe(path: DataBatches):
    """Every row of the batches, once (streamed, with a progress bar); `data_samples` in --params caps it."""
    if path.how == "none":
        return Skipped(("data.labels", "data.eos", "data.truncation"))
    return DataStatistics(path).collect()


@dataclasses.dataclass(repr=False)
class Skipped(ProbeResult):
    """No --data: each check of the step says skip, and how to give the data."""

    checks: tuple[str, ...]

    def findings(self) -> list[Finding]:
        return [Finding(c, "skip", "No training data given", SKIP_MESSAGE, {}) for c in self.checks]

    def details(self):
        from workbench.display.nodes import Display, Paragraph

        return Display(Paragraph(f"{SKIP_MESSAGE}."))
