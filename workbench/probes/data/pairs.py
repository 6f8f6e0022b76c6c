"""data.pairs: a preference run's pairs as the loss will read them — the trainer's own prepared dataset through its
own collator and truncation — and the pairs whose chosen and rejected are the same tokens there.

trl 1.16's `DPOTrainer` tokenizes each row into `prompt_ids`, `chosen_ids`, `rejected_ids` and its
`DataCollatorForPreference` (dpo_trainer.py:147-200) builds `input_ids` with every chosen sequence first and every
rejected one after, truncated to `max_length` by `truncation_mode`, and `completion_mask` marking the completion
tokens that survive. A pair whose chosen and rejected completion tokens are identical there gives the loss nothing to
separate: identical rows, or rows that differ only past `max_length` (the prompt fills the window). Such pairs
train nothing (margin 0, loss ln 2 under the sigmoid loss) — the run autopsy's `run.preference_signal` sees them
afterwards when every pair is so.
"""

from __future__ import annotations

import dataclasses

from workbench.display.nodes import Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.errors import NotApplicable
from workbench.findings import Finding

CHECK = "data.pairs"
SHARE = 0.01  # identical pairs in 1 % of the rows read or more: fail (data.labels' threshold for unsupervised rows)
ROWS = 2000  # pairs read at most (the collator on the trainer's prepared rows, batch by batch)
BATCH = 64


@dataclasses.dataclass(repr=False)
class PairsResult(ProbeResult):
    trainer: str
    rows: int
    identical: list[int]  # dataset indices of pairs identical where the loss reads them
    emptied: list[int]  # of those, the pairs whose completions max_length cut away entirely
    truncated: list[int]  # of those, the pairs that differ in the dataset: max_length made them equal
    max_length: int | None
    truncation_mode: str | None

    def findings(self) -> list[Finding]:
        evidence = {"trainer": self.trainer, "rows_read": self.rows, "identical_rows": self.identical[:50],
                    "completions_cut_away": self.emptied[:50], "made_equal_by_truncation": self.truncated[:50],
                    "max_length": self.max_length,
                    "truncation_mode": self.truncation_mode}
        if not self.identical:
            return [Finding(CHECK, "pass", f"Every one of {self.rows} pairs differs where the loss reads it",
                            f"Your {self.trainer}'s own collator and truncation (max_length={self.max_length}, "
                            f"{self.truncation_mode}).", evidence)]
        share = len(self.identical) / max(self.rows, 1)
        cut = (f"; {len(self.truncated)} of them differ in the dataset and only max_length={self.max_length} "
               f"({self.truncation_mode}) made them equal" if self.truncated else "; they are equal in the dataset")
        cut += (f", {len(self.emptied)} with both completions cut away entirely" if self.emptied else "")
        rows = ", ".join(map(str, self.identical[:8])) + (" …" if len(self.identical) > 8 else "")
        return [Finding(
            CHECK, "fail" if share >= SHARE else "warn",
            f"{len(self.identical)} of {self.rows} pairs ({share:.1%}) have chosen == rejected where the loss reads them",
            f"Rows {rows}: after your {self.trainer}'s tokenization and its collator's truncation, the chosen and "
            f"rejected completion tokens are the same{cut}. Such a pair has a margin of 0 at every step (ln 2 "
            "under the sigmoid loss): it trains nothing.", evidence,
            (f"Raise `max_length` (now {self.max_length}) or shorten the prompts so that the answers fit"
             if self.truncated else "") + ("; " if self.truncated and len(self.truncated) < len(self.identical) else
                                          "." if self.truncated else "")
            + ("drop the rows whose chosen equals rejected (compare them after the chat template) before training."
               if len(self.truncated) < len(self.identical) else ""))]

    def view(self):
        return Display(Paragraph(f"{self.rows} pairs through your {self.trainer}'s collator (max_length="
                                 f"{self.max_length}, {self.truncation_mode}); identical where the loss reads them: "
                                 f"{len(self.identical)}."),
                       Table(["row", "completions cut away"],
                             [[str(i), "yes" if i in self.emptied else ""] for i in self.identical[:20]], left=True))


def _trainer(target, prepared):
    trainer = getattr(prepared, "trainer", None)
    if trainer is None and target is not None:
        from workbench.model.setups import BUILTIN_SETUPS

        if getattr(target, "setup", None) not in BUILTIN_SETUPS:  # a user's set-up may return its trainer
            from workbench.model.shared import prepare_shared

            trainer = getattr(prepare_shared(target), "trainer", None)
    return trainer


def preference_pairs_probe(target, prepared=None) -> PairsResult:
    trainer = _trainer(target, prepared)
    dataset = getattr(trainer, "train_dataset", None)
    collator = getattr(trainer, "data_collator", None)
    if dataset is None or not {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(getattr(dataset, "column_names",
                                                                                        None) or ()):
        raise NotApplicable("no preference trainer with a tokenized train_dataset (trl's DPOTrainer: prompt_ids, "
                            "chosen_ids, rejected_ids) in this run", "not a preference trainer")
    n = min(len(dataset), ROWS)
    identical, emptied, truncated = [], [], []
    for start in range(0, n, BATCH):
        rows = [dataset[i] for i in range(start, min(start + BATCH, n))]
        batch = collator(rows)
        ids, mask = batch["input_ids"], batch["completion_mask"].bool()
        half = len(rows)
        for j in range(half):
            chosen = ids[j][mask[j]].tolist()
            rejected = ids[half + j][mask[half + j]].tolist()
            if chosen == rejected:
                identical.append(start + j)
                if not chosen:
                    emptied.append(start + j)
                if rows[j]["chosen_ids"] != rows[j]["rejected_ids"]:
                    truncated.append(start + j)
    args = trainer.args
    return PairsResult(type(trainer).__name__, n, identical, emptied, truncated, getattr(args, "max_length", None),
                       getattr(args, "truncation_mode", None))
