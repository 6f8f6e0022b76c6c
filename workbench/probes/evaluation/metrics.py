"""Evaluation metrics over per-sample records, and the greedy evaluation that produces the records.

A record is one sample's outcome (`SampleRecord`): the model's answer, the box parsed from it, its IoU with the
reference, the teacher-forced loss and token accuracy, and the error when something went wrong. A metric is a
pure function of a list of records, registered by name:

    >>> @register_metric("always_one")
    ... def always_one(records):
    ...     return 1.0
    >>> compute_metrics([], ["always_one"])
    {'always_one': 1.0}
    >>> del METRICS["always_one"]

Failures are never dropped. A sample whose answer has no box counts as IoU 0 and as not detected; a sample
whose generation raised counts the same way and keeps its exception; a dataset row that could not be read has
no reference to score against, so it is left out of the rates but counted (`summarize` → `errors`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from workbench.demo.grounding import Box, parse_box
from workbench.model.inputs import vlm_inputs
from workbench.model.loading import first_device
from workbench.resources import free_memory

Metric = Callable[[Sequence["SampleRecord"]], "float | None"]
METRICS: dict[str, Metric] = {}

# the seeds' table: Model | Mean IoU | Det rate | IoU>0.5 | IoU>0.7
TABLE_COLUMNS = {"mean_iou": "Mean IoU", "detection_rate": "Det rate", "iou>0.5": "IoU>0.5", "iou>0.7": "IoU>0.7"}
ERROR_KINDS = ("dataset", "exception", "parse")


@dataclasses.dataclass
class SampleRecord:
    """One sample's outcome. `error_kind`: `dataset` (the row was unreadable: not scored), `exception` (the model
    raised), `parse` (the answer holds no usable box)."""

    index: int
    reference: str | None = None
    box: Box | None = None
    prediction: str | None = None
    predicted_box: Box | None = None
    iou: float | None = None
    loss: float | None = None
    token_accuracy: float | None = None
    error: str | None = None
    error_kind: str | None = None
    seconds: float = 0.0

    @property
    def scored(self) -> bool:
        """Whether the sample had a reference to score against."""
        return self.error_kind != "dataset"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def register_metric(name: str) -> Callable[[Metric], Metric]:
    """Register `fn(records) -> float | None` under `name` (a name is registered once)."""
    def register(fn: Metric) -> Metric:
        if name in METRICS:
            raise ValueError(f"metric {name!r} is already registered")
        METRICS[name] = fn
        return fn
    return register


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes; 0 when the union is empty.

    >>> box_iou((0, 0, 10, 10), (5, 0, 15, 10))
    0.3333333333333333
    """
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _scored(records: Sequence[SampleRecord]) -> list[SampleRecord]:
    return [r for r in records if r.scored]


def _fraction(records: Sequence[SampleRecord], keep: Callable[[SampleRecord], bool]) -> float | None:
    scored = _scored(records)
    return sum(1 for r in scored if keep(r)) / len(scored) if scored else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


@register_metric("mean_iou")
def mean_iou(records: Sequence[SampleRecord]) -> float | None:
    """Mean IoU over scored samples; a sample without a predicted box counts as 0."""
    scored = _scored(records)
    return sum(r.iou or 0.0 for r in scored) / len(scored) if scored else None


@register_metric("detection_rate")
def detection_rate(records: Sequence[SampleRecord]) -> float | None:
    """Fraction of scored samples whose answer held a box."""
    return _fraction(records, lambda r: r.predicted_box is not None)


@register_metric("iou>0.5")
def iou_above_half(records: Sequence[SampleRecord]) -> float | None:
    """Fraction of scored samples with IoU strictly above 0.5."""
    return _fraction(records, lambda r: (r.iou or 0.0) > 0.5)


@register_metric("iou>0.7")
def iou_above_seven_tenths(records: Sequence[SampleRecord]) -> float | None:
    """Fraction of scored samples with IoU strictly above 0.7."""
    return _fraction(records, lambda r: (r.iou or 0.0) > 0.7)


@register_metric("exact_match")
def exact_match(records: Sequence[SampleRecord]) -> float | None:
    """Fraction of scored samples whose answer equals the reference (surrounding whitespace ignored)."""
    return _fraction(records, lambda r: r.prediction is not None and r.reference is not None
                     and r.prediction.strip() == r.reference.strip())


@register_metric("loss")
def teacher_forced_loss(records: Sequence[SampleRecord]) -> float | None:
    """Mean teacher-forced cross-entropy of the reference answer, over the samples where it was computed."""
    return _mean(r.loss for r in records)


@register_metric("token_accuracy")
def token_accuracy(records: Sequence[SampleRecord]) -> float | None:
    """Mean teacher-forced token accuracy of the reference answer, over the samples where it was computed."""
    return _mean(r.token_accuracy for r in records)


def compute_metrics(records: Sequence[SampleRecord], names: Iterable[str] | None = None) -> dict[str, float | None]:
    """{metric name: value} for the named metrics (all registered ones by default)."""
    return {name: METRICS[name](records) for name in (names if names is not None else METRICS)}


def summarize(records: Sequence[SampleRecord]) -> dict[str, Any]:
    """Every metric, plus how many samples there were, how many were scored, and the failures by kind."""
    errors = {kind: sum(1 for r in records if r.error_kind == kind) for kind in ERROR_KINDS}
    return {**compute_metrics(records), "n": len(records), "scored": len(_scored(records)), "errors": errors}


def metrics_table(results: Mapping[str, Sequence[SampleRecord]]) -> list[dict[str, Any]]:
    """The seeds' table, one row per model: Model | Mean IoU | Det rate | IoU>0.5 | IoU>0.7, plus the sample
    count and the failures (exceptions + unparsable answers; unreadable dataset rows apart)."""
    rows = []
    for model_name, records in results.items():
        summary = summarize(records)
        row: dict[str, Any] = {"Model": model_name}
        row.update({label: summary[name] for name, label in TABLE_COLUMNS.items()})
        row.update({"n": summary["scored"], "failed": summary["errors"]["exception"] + summary["errors"]["parse"],
                    "unreadable rows": summary["errors"]["dataset"]})
        rows.append(row)
    return rows


# --- teacher forcing: the reference answer scored token by token -----------------------------------------------

def teacher_forced_inputs(tokenizer, image_processor, image, question: str, answer: str) -> dict:
    """`vlm_inputs` for the question followed by the answer and the end-of-turn token, with `labels` masked
    (-100) on the prompt: what a training step and a teacher-forced evaluation both feed the model."""
    import torch

    prompt = vlm_inputs(tokenizer, image_processor, image, question)
    answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False,
                           return_tensors="pt")["input_ids"]
    n_prompt = prompt["input_ids"].shape[1]
    return {
        **prompt,
        "input_ids": torch.cat([prompt["input_ids"], answer_ids], dim=1),
        "attention_mask": torch.ones(1, n_prompt + answer_ids.shape[1], dtype=torch.long),
        "mm_token_type_ids": torch.cat([prompt["mm_token_type_ids"], torch.zeros_like(answer_ids)], dim=1),
        "labels": torch.cat([torch.full((1, n_prompt), -100), answer_ids], dim=1),
    }


def collate_teacher_forced(items: Sequence[dict], pad_token_id: int) -> dict:
    """Batch `teacher_forced_inputs`: token rows padded on the right, images concatenated."""
    import torch
    from torch.nn.functional import pad

    length = max(item["input_ids"].shape[1] for item in items)
    fill = {"input_ids": pad_token_id, "attention_mask": 0, "mm_token_type_ids": 0, "labels": -100}
    batch = {key: torch.cat([pad(item[key], (0, length - item[key].shape[1]), value=value) for item in items])
             for key, value in fill.items()}
    batch["pixel_values"] = torch.cat([item["pixel_values"] for item in items])
    batch["image_grid_thw"] = torch.cat([item["image_grid_thw"] for item in items])
    return batch


def teacher_forced_scores(model, inputs: dict) -> tuple[float, float]:
    """(loss, token accuracy) of one sample's labelled tokens: mean cross-entropy, and the fraction of them the
    model ranks first, each predicted from the tokens before it."""
    import torch

    labels = inputs["labels"]
    model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**model_inputs).logits[:, :-1].float()
    targets = labels[:, 1:].to(logits.device)
    mask = targets != -100
    loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
    accuracy = (logits.argmax(-1)[mask] == targets[mask]).float().mean()
    return float(loss), float(accuracy)


# --- greedy evaluation ------------------------------------------------------------------------------------------

def _on(inputs: dict, device) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}


def generate_answer(model, tokenizer, image_processor, image, question: str, max_new_tokens: int) -> str:
    """The model's greedy answer to one image + question (special tokens removed)."""
    return generate_answers(model, tokenizer, [vlm_inputs(tokenizer, image_processor, image, question)],
                            max_new_tokens)[0]


def collate_prompts(items: Sequence[dict], pad_token_id: int) -> dict:
    """Batch `vlm_inputs` for generation: token rows padded on the left (generation appends on the right; the
    attention mask and M-RoPE's positions skip the padding), images concatenated."""
    import torch
    from torch.nn.functional import pad

    length = max(item["input_ids"].shape[1] for item in items)
    fill = {"input_ids": pad_token_id, "attention_mask": 0, "mm_token_type_ids": 0}
    batch = {key: torch.cat([pad(item[key], (length - item[key].shape[1], 0), value=value) for item in items])
             for key, value in fill.items() if key in items[0]}
    for key in ("pixel_values", "image_grid_thw"):
        batch[key] = torch.cat([item[key] for item in items])
    return batch


def generate_answers(model, tokenizer, prompts: Sequence[dict], max_new_tokens: int) -> list[str]:
    """Greedy answers (`do_sample=False`) to a batch of `vlm_inputs`, decoded without special tokens."""
    import torch

    batch = _on(collate_prompts(prompts, tokenizer.pad_token_id) if len(prompts) > 1 else prompts[0],
                first_device(model))
    with torch.no_grad():
        output = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    start = batch["input_ids"].shape[1]
    return [tokenizer.decode(row[start:], skip_special_tokens=True) for row in output]


def teacher_forced_batch_scores(model, batch: dict) -> list[tuple[float, float]]:
    """`teacher_forced_scores` of every row of a `collate_teacher_forced` batch, each over its own labelled tokens."""
    import torch

    labels = batch["labels"]
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].float()
    targets = labels[:, 1:].to(logits.device)
    scores = []
    for row_logits, row_targets in zip(logits, targets):
        mask = row_targets != -100
        loss = torch.nn.functional.cross_entropy(row_logits[mask], row_targets[mask])
        scores.append((float(loss), float((row_logits.argmax(-1)[mask] == row_targets[mask]).float().mean())))
    return scores


def _score_answer(record: SampleRecord, prediction: str) -> None:
    record.prediction = prediction
    record.predicted_box, parse_error = parse_box(prediction)
    if parse_error:
        record.error, record.error_kind = parse_error, "parse"
    elif record.box is not None:
        record.iou = box_iou(record.predicted_box, record.box)


def _failed(record: SampleRecord, exc: BaseException) -> None:
    record.error, record.error_kind = f"{type(exc).__name__}: {exc}", "exception"


def evaluate_sample(model, tokenizer, image_processor, row: Any, index: int, max_new_tokens: int,
                    teacher_forcing: bool = True) -> SampleRecord:
    """One row (`grounding.GroundingRow` or `grounding.Sample`) → its record; exceptions land in the record."""
    return evaluate_samples(model, tokenizer, image_processor, [row], max_new_tokens,
                            teacher_forcing=teacher_forcing, first_index=index)[0]


def evaluate_samples(model, tokenizer, image_processor, rows: Sequence[Any], max_new_tokens: int = 32,
                     progress: Callable[[int, int, SampleRecord], Any] | None = None,
                     teacher_forcing: bool = True, batch_size: int = 16, first_index: int = 0) -> list[SampleRecord]:
    """Greedy generation (`do_sample=False`) on every row, parsed and scored: one record per row, in order.

    Rows run `batch_size` at a time (left-padded prompts, one `generate`; the teacher-forced pass right-padded):
    a tiny model's generation is per-step overhead, so a batch of 16 costs about what one sample did. A batch that
    raises is run again one sample at a time, so each failure stays with its own row. `progress(done, total,
    record)` is called for each row in order, as its batch completes; a record's `seconds` is its share of its
    batch. The model is put in eval mode for the run and given back in the mode it came in."""
    records = [SampleRecord(index=first_index + i, reference=getattr(row, "answer", None), box=getattr(row, "box", None))
               for i, row in enumerate(rows)]
    was_training = getattr(model, "training", False)
    model.eval()
    done = 0
    try:
        for start in range(0, len(rows), max(1, batch_size)):
            chunk = list(zip(records[start:start + batch_size], rows[start:start + batch_size]))
            clock = time.perf_counter()
            _evaluate_batch(model, tokenizer, image_processor, chunk, max_new_tokens, teacher_forcing)
            share = (time.perf_counter() - clock) / len(chunk)
            for record, _row in chunk:
                record.seconds = share
                done += 1
                if progress is not None:
                    progress(done, len(rows), record)
    finally:
        model.train(was_training)
    return records


def _evaluate_batch(model, tokenizer, image_processor, chunk, max_new_tokens: int, teacher_forcing: bool) -> None:
    prompts = []  # (record, row, inputs) of the rows that could be turned into model inputs
    for record, row in chunk:
        if getattr(row, "error", None):
            record.error, record.error_kind = row.error, "dataset"
            continue
        try:
            prompts.append((record, row, vlm_inputs(tokenizer, image_processor, row.image, row.question)))
        except Exception as exc:  # noqa: BLE001 - a sample that crashes is that sample's failure, not the run's
            _failed(record, exc)
    if not prompts:
        return
    try:
        answers = generate_answers(model, tokenizer, [inputs for _, _, inputs in prompts], max_new_tokens)
    except Exception:  # noqa: BLE001 - out of memory, or one bad sample: one at a time, each failure its own
        answers = None
        free_memory()
    generated = []
    for i, (record, row, inputs) in enumerate(prompts):
        try:
            _score_answer(record, answers[i] if answers is not None else
                          generate_answers(model, tokenizer, [inputs], max_new_tokens)[0])
            generated.append((record, row))
        except Exception as exc:  # noqa: BLE001
            _failed(record, exc)
    if not teacher_forcing:
        return
    forced = []
    for record, row in generated:
        if record.reference is None:
            continue
        try:
            forced.append((record, teacher_forced_inputs(tokenizer, image_processor, row.image, row.question,
                                                         record.reference)))
        except Exception as exc:  # noqa: BLE001
            _failed(record, exc)
    if not forced:
        return
    device = first_device(model)
    try:
        scores = teacher_forced_batch_scores(model, _on(collate_teacher_forced([i for _, i in forced],
                                                                               tokenizer.pad_token_id), device))
    except Exception:  # noqa: BLE001
        scores = None
        free_memory()
    for i, (record, inputs) in enumerate(forced):
        try:
            record.loss, record.token_accuracy = (scores[i] if scores is not None
                                                  else teacher_forced_scores(model, _on(inputs, device)))
        except Exception as exc:  # noqa: BLE001
            _failed(record, exc)
