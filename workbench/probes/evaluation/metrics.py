"""Evaluation metrics over per-sample records (the greedy evaluation that produces them: `generation`).

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
from typing import Any, Callable, Iterable, Mapping, Sequence

from workbench.tasks.grounding import Box

Metric = Callable[[Sequence["SampleRecord"]], "float | None"]
METRICS: dict[str, Metric] = {}

# the grounding table (docs/demo.md): Model | Mean IoU | Det rate | IoU>0.5 | IoU>0.7
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
    """The grounding table, one row per model: Model | Mean IoU | Det rate | IoU>0.5 | IoU>0.7, plus the sample
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


