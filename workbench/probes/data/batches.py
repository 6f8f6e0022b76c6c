"""The batches the training run sees, row by row: built by your Trainer, or by trl's own SFT preparation.

    path = data_path_probe(target, samples=None, max_length=None)
    for row in path.rows(): row.ids, row.labels     # as the collator hands them to the model, padding removed

Two sources of truth, never a re-implementation of the masking:
- the set-up returned a `transformers.Trainer` / trl `SFTTrainer`: its `train_dataset`, `data_collator` and
  `get_train_dataloader()` (with a sequential sampler, so rows keep their order and can be named);
- otherwise trl's `SFTTrainer._prepare_dataset` (ChatML conversion, EOS, tokenization, labels from the
  completion / assistant masks) run lazily over the streamed rows with the checkpoint's tokenizer and template,
  then trl's `DataCollatorForLanguageModeling`. Preparation runs with `max_length=None` so that each row's full
  length is known; the cut trl makes (`truncation_mode`'s slice) and the rows trl then drops (nothing left to
  supervise) are applied here on the prepared ids, exactly as `_prepare_dataset` states them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Iterator

from workbench.display.result import ProbeResult
from workbench.errors import NotApplicable

IGNORE = -100
TEMPLATE_PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]


@dataclasses.dataclass
class Row:
    index: int  # position in the source (trl path) or in the Trainer's train_dataset
    ids: list[int]  # as batched (truncated), padding removed
    labels: list[int] | None  # as batched; None: trl drops the row (nothing supervised after truncation)
    full_length: int  # before truncation
    window: tuple[int, int]  # the slice of the full row that was kept
    answer_start: int | None  # in full-row coordinates; None: no answer located (text rows)
    raw: dict[str, Any] | None = None  # the source row's own text fields (before trl appends EOS), where available
    full_supervised: int | None = None  # supervised tokens before truncation (trl path, dropped rows)
    prompt_end: int | None = None  # where the first answer starts (multi-turn: earlier answers are not prompt)

    @property
    def cut(self) -> bool:
        """Cut by max_length. A Trainer's rows come truncated: one at max_length counts as cut (it may fit exactly)."""
        lo, hi = self.window
        return hi - lo < self.full_length or self.at_limit

    at_limit: bool = False


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chat_ids(tokenizer, messages, **kwargs) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    return list(out["input_ids"])


def special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(token_id))
    return ids


def template_markers(tokenizer) -> tuple[list[int] | None, set[int]]:
    """(the token ids that open an assistant turn, the ids that end one) for the tokenizer's chat template."""
    stops = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if not getattr(tokenizer, "chat_template", None):
        return None, stops
    try:
        with_prompt = chat_ids(tokenizer, TEMPLATE_PROBE[:1], add_generation_prompt=True)
        without = chat_ids(tokenizer, TEMPLATE_PROBE[:1])
        marker = with_prompt[common_prefix_length(with_prompt, without):] or None
        full = chat_ids(tokenizer, TEMPLATE_PROBE)
        start = find_last(full, marker) if marker else None
        specials = special_ids(tokenizer)
        if start is not None:
            after = [t for t in full[start + len(marker):] if t in specials]
            if after:
                stops.add(after[0])  # the template's end-of-turn token
    except Exception:  # noqa: BLE001 - a template that cannot render this probe: no marker, EOS alone
        return None, stops
    return marker, stops


def answer_start(ids: list[int], marker: list[int] | None) -> int | None:
    """Where the last assistant turn's content starts: after the last assistant marker (None: no marker)."""
    at = find_last(ids, marker)
    return None if at is None else at + len(marker)


def find_first(ids: list[int], marker: list[int] | None) -> int | None:
    if not marker:
        return None
    m, first = len(marker), marker[0]
    for i in range(len(ids) - m + 1):
        if ids[i] == first and ids[i:i + m] == marker:
            return i
    return None


def find_last(ids: list[int], marker: list[int] | None) -> int | None:
    if not marker:
        return None
    m, first = len(marker), marker[0]
    for i in range(len(ids) - m, -1, -1):
        if ids[i] == first and ids[i:i + m] == marker:
            return i
    return None


@dataclasses.dataclass(repr=False)
class DataBatches(ProbeResult):
    """How the batches are built, and a fresh row stream each time `rows()` is called."""

    source: Any  # DataSource, or None without --data
    how: str  # "trainer" | "trl" | "none"
    tokenizer: Any = None
    max_length: int | None = None
    truncation_mode: str = "keep_start"
    completion_only_loss: bool | None = None
    assistant_only_loss: bool = False
    samples: int | None = None
    trainer: Any = None
    batch_size: int = 8
    marker: list[int] | None = None
    stop_ids: frozenset[int] = frozenset()
    notes: list[str] = dataclasses.field(default_factory=list)
    trainer_rows: int | None = None  # len(train_dataset), when it has one
    collator_name: str = ""

    def __post_init__(self) -> None:
        if self.trainer is not None:
            dataset = self.trainer.train_dataset
            self.trainer_rows = len(dataset) if hasattr(dataset, "__len__") else None
            self.collator_name = f"your {type(self.trainer).__name__}'s collator ({type(self.trainer.data_collator).__name__})"

    def release(self) -> None:
        """Drop the Trainer (and the model it holds) once its rows have been read."""
        self.trainer = None

    @property
    def total(self) -> int | None:
        if self.how == "trainer":
            n = self.trainer_rows
            return min(n, self.samples) if (n is not None and self.samples) else n
        return self.source.count(self.samples) if self.source is not None else 0

    @property
    def pad_token_id(self) -> int | None:
        return getattr(self.tokenizer, "pad_token_id", None)

    @property
    def eos_token_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_token_id", None)

    @property
    def masking(self) -> str:
        if self.how == "trainer":
            return self.collator_name
        if self.assistant_only_loss:
            return "assistant-only loss (trl's assistant masks)"
        if self.completion_only_loss:
            return "completion-only loss (trl's completion mask)"
        return "the whole sequence (trl's language modeling)"

    @property
    def meant_answer_only(self) -> bool | None:
        """Whether the run means to supervise only the answer (None: your Trainer's collator decides)."""
        if self.how == "trainer":
            return None
        return bool(self.assistant_only_loss or self.completion_only_loss)

    def window(self, length: int) -> tuple[int, int]:
        if self.max_length is None or length <= self.max_length:
            return 0, length
        if self.truncation_mode == "keep_end":
            return length - self.max_length, length
        return 0, self.max_length

    def rows(self) -> Iterator[Row]:
        if self.how == "trainer":
            return self._trainer_rows()
        if self.how == "trl":
            return self._trl_rows()
        return iter(())

    # -- the user's Trainer -------------------------------------------------------------------------------------
    def _trainer_rows(self) -> Iterator[Row]:
        from torch.utils.data import SequentialSampler

        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("the Trainer was released after the statistics read its rows; run data_path again")
        trainer._get_train_sampler = lambda *a, **k: SequentialSampler(trainer.train_dataset)
        try:
            loader = trainer.get_train_dataloader()
        finally:
            del trainer._get_train_sampler
        index = 0
        config = getattr(trainer.model, "config", None)
        encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        for batch in loader:
            if not isinstance(batch, Mapping):
                raise ValueError(f"your {type(trainer).__name__}'s batches are {type(batch).__name__}s, not dicts "
                                 "of tensors: the data path reads labelled batches")
            if "labels" not in batch:
                raise ValueError(f"your {type(trainer).__name__}'s batches carry no labels (keys: {sorted(batch)}): "
                                 "the model computes no loss from them; give the collator labels")
            if encoder_decoder:
                yield from self._target_rows(batch["labels"].tolist(), index)
                index += len(batch["labels"])
                if self.samples and index >= self.samples:
                    return
                continue
            ids, labels = batch["input_ids"].tolist(), batch["labels"].tolist()
            mask = batch["attention_mask"].tolist() if "attention_mask" in batch else None
            for i in range(len(ids)):
                keep = [j for j, m in enumerate(mask[i]) if m] if mask is not None else range(len(ids[i]))
                row_ids = [ids[i][j] for j in keep]
                row_labels = [labels[i][j] for j in keep]
                first = find_first(row_ids, self.marker)
                yield Row(index, row_ids, row_labels, len(row_ids), (0, len(row_ids)),
                          answer_start(row_ids, self.marker),
                          prompt_end=None if first is None else first + len(self.marker),
                          at_limit=self.max_length is not None and len(row_ids) >= self.max_length)
                index += 1
                if self.samples and index >= self.samples:
                    return

    def _target_rows(self, labels: list[list[int]], index: int) -> Iterator[Row]:
        """An encoder-decoder's rows: its labels are the decoder's target, a sequence of their own (not aligned
        with input_ids, which the encoder reads whole), all of it answer. The collator pads them with -100
        (DataCollatorForSeq2Seq's label_pad_token_id): the row ends at its last supervised token; a -100 inside
        it stays a masked label (its id shown as the pad token)."""
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        for offset, row_labels in enumerate(labels):
            end = max((j + 1 for j, label in enumerate(row_labels) if label != IGNORE), default=0)
            row_labels = row_labels[:end]
            row_ids = [label if label != IGNORE else pad for label in row_labels]
            yield Row(index + offset, row_ids, row_labels, len(row_ids), (0, len(row_ids)), 0, prompt_end=0,
                      at_limit=self.max_length is not None and len(row_ids) >= self.max_length)
            if self.samples and index + offset + 1 >= self.samples:
                return

    # -- trl's preparation --------------------------------------------------------------------------------------
    def _trl_rows(self) -> Iterator[Row]:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        prepared = self._trl_prepared()
        collator = DataCollatorForLanguageModeling(pad_token_id=self.pad_token_id if self.pad_token_id is not None
                                                   else self.eos_token_id)
        pending: list[Row] = []
        for example in prepared:
            ids, labels = example["input_ids"], example["labels"]
            lo, hi = self.window(len(ids))
            kept_labels = labels[lo:hi]
            row = Row(example["_workbench_row"], ids[lo:hi], kept_labels, len(ids), (lo, hi),
                      self._answer_start(example, ids), json.loads(example["_workbench_raw"]))
            if "messages" in example:
                first = find_first(ids, self.marker)
                row.prompt_end = None if first is None else first + len(self.marker)
            if self.max_length is not None and all(label == IGNORE for label in kept_labels):
                row.labels = None  # trl's filter drops it: it never reaches a batch
                row.full_supervised = sum(1 for label in labels if label != IGNORE)
                yield row
                continue
            pending.append(row)
            if len(pending) == self.batch_size:
                yield from self._collate(collator, pending)
                pending = []
        if pending:
            yield from self._collate(collator, pending)

    @staticmethod
    def _collate(collator, rows: list[Row]) -> Iterator[Row]:
        batch = collator([{"input_ids": r.ids, "labels": r.labels} for r in rows])
        labels, mask = batch["labels"].tolist(), batch["attention_mask"].tolist()
        for r, row_labels, row_mask in zip(rows, labels, mask):
            r.labels = [label for label, m in zip(row_labels, row_mask) if m]
            yield r

    def _answer_start(self, example: dict[str, Any], ids: list[int]) -> int | None:
        if "messages" in example or isinstance(example.get("prompt"), list):
            return answer_start(ids, self.marker)
        if "completion_mask" in example:
            return example["completion_mask"].index(1) if 1 in example["completion_mask"] else len(ids)
        if isinstance(example.get("prompt"), str):
            return common_prefix_length(self.tokenizer(example["prompt"])["input_ids"], ids)
        return None

    def _trl_prepared(self):
        from trl import SFTConfig
        from trl.chat_template_utils import get_training_chat_template, has_generation_markers
        from trl.trainer.sft_trainer import SFTTrainer

        # the row's own text is kept aside: trl's preparation rewrites it (add_eos appends the EOS text)
        dataset = self.source.iterable(self.samples).map(
            lambda row, i: {"_workbench_row": i, "_workbench_raw": json.dumps(raw_fields(row), default=str)},
            with_indices=True)
        with tempfile.TemporaryDirectory(prefix="workbench-data-") as out:
            args = SFTConfig(output_dir=out, report_to=[], use_cpu=True, bf16=False, max_length=None,
                             completion_only_loss=self.completion_only_loss,
                             assistant_only_loss=self.assistant_only_loss, dataset_kwargs={})
        # what SFTTrainer.__init__ sets before it prepares the dataset (the three attributes _prepare_dataset reads)
        state = _TrlState()
        state._tokenizer = self.tokenizer
        state.chat_template = (get_training_chat_template(self.tokenizer) if self.assistant_only_loss and not
                               has_generation_markers(self.tokenizer.chat_template) else None)
        state.completion_only_loss = bool(self.completion_only_loss)
        return SFTTrainer._prepare_dataset(state, dataset, self.tokenizer, args, False, None, "train")

    def details(self):
        from workbench.display.nodes import Bullets, Code, Display, Inline, Paragraph

        if self.how == "none":
            return Display(Paragraph("No training data given: pass ", Code("--data FILE"), " (",
                                     Code("make diagnose DATA=FILE"), ", or ", Code('data = "FILE"'),
                                     " in this notebook's parameters)."))
        built = ("your set-up's Trainer: its train_dataset, data_collator and get_train_dataloader() (sequential)"
                 if self.how == "trainer" else "trl's SFT preparation and collator, with the checkpoint's tokenizer")
        items = [Inline("Data: ", Code(self.source.describe() if self.source else "(the Trainer’s own)")),
                 f"Batches built by {built}", f"Loss on {self.masking}",
                 f"max_length: {self.max_length if self.max_length is not None else 'none'} "
                 f"({self.truncation_mode}); rows read: {self.total if self.total is not None else 'all'}",
                 f"pad id {self.pad_token_id}, EOS id {self.eos_token_id}, end-of-turn ids {sorted(self.stop_ids)}",
                 *self.notes]
        return Display(Bullets(items))


class _TrlState:
    """Stands in for the SFTTrainer instance whose `_prepare_dataset` is called (no model is needed for it)."""


def raw_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A source row's text fields as written, message contents reduced to their text."""
    return {k: _text_of(row[k]) for k in ("messages", "prompt", "completion", "text") if k in row}


def _text_of(value):
    if not isinstance(value, list):
        return value
    return [{**m, "content": message_text(m.get("content"))} if isinstance(m, dict) else m for m in value]


def message_text(content) -> Any:
    """A message's content as text: a string as is, content parts joined by their text."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


# trl's trainers whose batches are no supervised (labelled) sequences, and what they are instead (trl 1.16)
UNSUPERVISED_BATCHES = {
    "GRPOTrainer": "prompts; the completions are generated during training (train.rl_rollout scores a batch)",
    "RLOOTrainer": "prompts; the completions are generated during training (train.rl_rollout scores a batch)",
    "OnlineDPOTrainer": "prompts; the completions are generated during training",
    "DPOTrainer": "chosen and rejected pairs (the run autopsy's run.preference_signal reads their margins)",
    "KTOTrainer": "completions labelled desirable or not",
    "ORPOTrainer": "chosen and rejected pairs", "CPOTrainer": "chosen and rejected pairs",
    "RewardTrainer": "chosen and rejected pairs scored by a classifier head",
}


def refuse_unsupervised_batches(trainer) -> None:
    """NotApplicable for a trl trainer whose batches are not labelled sequences: the data path's checks (labels,
    EOS, truncation, template) read a supervised run's batches."""
    for cls in type(trainer).__mro__:
        what = UNSUPERVISED_BATCHES.get(cls.__name__)
        if what is not None:
            raise NotApplicable(f"your {type(trainer).__name__}'s batches are {what}: the data path reads a "
                                "supervised run's labelled batches", f"a {cls.__name__}")


def data_path_probe(target, samples: int | None = None, max_length: int | None = None) -> DataBatches:
    """How the run builds its batches from --data (nothing is read yet: the statistics stream it)."""
    from workbench.model.loading import load_processor
    from workbench.model.setups import BUILTIN_SETUPS, prepare_model
    from workbench.probes.data.sources import open_source

    data = getattr(target, "data", None)
    if not data:
        return DataBatches(None, "none")
    source = open_source(data)
    params = target.params or {}
    notes: list[str] = []
    trainer = None
    if target.setup not in BUILTIN_SETUPS:  # only a user's set-up can hand back its Trainer
        prepared = prepare_model(target)
        trainer, processor = prepared.trainer, prepared.processor
    else:
        processor = load_processor(target.model_dir)
    if trainer is not None:  # the tokenizer the run pads with: the Trainer's, else its collator's
        refuse_unsupervised_batches(trainer)
        collator = trainer.data_collator
        processor = (getattr(trainer, "processing_class", None) or getattr(collator, "tokenizer", None)
                     or getattr(collator, "processor", None) or processor)
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer is None:
        raise ValueError(f"no tokenizer saved in {target.model_dir}: the data path needs the run's tokenizer")
    marker, stops = template_markers(tokenizer)
    if trainer is not None:
        args = trainer.args
        limit = getattr(args, "max_length", None)  # the Trainer's own (trl's SFTConfig), else the parameter
        limit = max_length if limit is None else limit
        path = DataBatches(source, "trainer", tokenizer, limit, getattr(args, "truncation_mode", "keep_start"),
                        trainer=trainer, samples=samples, batch_size=args.per_device_train_batch_size,
                        marker=marker, stop_ids=frozenset(stops), notes=notes)
        n = path.total
        if n is not None and n != source.count(samples):
            notes.append(f"the Trainer's train_dataset holds {n:,} rows for {source.count(samples):,} in --data "
                         "(rows are named by their position in train_dataset)")
        return path
    if max_length is None:
        from trl import SFTConfig

        max_length = SFTConfig.__dataclass_fields__["max_length"].default
        notes.append(f"max_length {max_length}: trl's SFTConfig default (set max_length in --params to yours)")
    return DataBatches(source, "trl", tokenizer, max_length, "keep_start",
                    # trl's default: completion-only for prompt/completion rows (SFTTrainer.__init__)
                    completion_only_loss=(params["completion_only_loss"] if params.get("completion_only_loss")
                                          is not None else source.format == "prompt-completion"),
                    assistant_only_loss=bool(params.get("assistant_only_loss", False)), samples=samples,
                    batch_size=int(params.get("per_device_train_batch_size", 8)), marker=marker,
                    stop_ids=frozenset(stops), notes=notes)


def batch_progress(total: int | None, desc: str):
    """A progress bar over rows (tqdm; in batch runs it prints sparsely)."""
    from tqdm.auto import tqdm

    batch = bool(os.environ.get("WORKBENCH_BATCH"))
    return tqdm(total=total, desc=desc, unit="row", mininterval=10 if batch else 0.2, leave=True)
