"""The greedy evaluation that produces the per-sample records the metrics score (`metrics.SampleRecord`).

Rows run `batch_size` at a time; a batch that raises is run again one sample at a time, so each failure stays with
its own row, and a sample's failure never stops the run.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from workbench.model.inputs import vlm_inputs
from workbench.model.loading import first_device
from workbench.model.memory import free_memory
from workbench.model.vlm_batches import collate_prompts, collate_teacher_forced, teacher_forced_inputs
from workbench.probes.evaluation.metrics import SampleRecord, box_iou
from workbench.tasks.grounding import parse_box


def teacher_forced_scores(model, inputs: dict) -> tuple[float, float]:
    """(loss, token accuracy) of one sample's labelled tokens: mean cross-entropy, and the fraction of them the
    model ranks first, each predicted from the tokens before it."""
    labels = inputs["labels"]
    model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**model_inputs).logits[:, :-1].float()
    targets = labels[:, 1:].to(logits.device)
    mask = targets != -100
    loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
    accuracy = (logits.argmax(-1)[mask] == targets[mask]).float().mean()
    return float(loss), float(accuracy)


def _on(inputs: dict, device) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}


def generate_answers(model, tokenizer, prompts: Sequence[dict], max_new_tokens: int) -> list[str]:
    """Greedy answers (`do_sample=False`) to a batch of `vlm_inputs`, decoded without special tokens."""
    batch = _on(collate_prompts(prompts, tokenizer.pad_token_id) if len(prompts) > 1 else prompts[0],
                first_device(model))
    with torch.no_grad():
        output = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    start = batch["input_ids"].shape[1]
    return [tokenizer.decode(row[start:], skip_special_tokens=True) for row in output]


def teacher_forced_batch_scores(model, batch: dict) -> list[tuple[float, float]]:
    """`teacher_forced_scores` of every row of a `collate_teacher_forced` batch, each over its own labelled tokens."""
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
