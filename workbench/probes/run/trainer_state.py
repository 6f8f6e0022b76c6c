"""trainer_state.json read into columns: the Trainer's log_history as numpy arrays, one pass over the entries.

The Trainer appends one dict per logging step (`loss`, `grad_norm`, `learning_rate`, `epoch`, `step`), one per
evaluation (`eval_loss`, `eval_*`, `step`) and one summary at the end (`train_loss`, `train_runtime`, ...). A value
the Trainer did not log is NaN in its column with `False` in the column's `*_logged` mask: a NaN it did log (a
`grad_norm` of nan) stays told apart from one it never wrote.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

_TRAIN_KEYS = ("step", "epoch", "loss", "grad_norm", "learning_rate")
_SAMPLE = 64  # entries whose keys name the extra metric columns: trl logs the same keys at every step
_EVAL_TIMING = frozenset({"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"})


@dataclasses.dataclass(frozen=True)
class TrainingLog:
    """The train-log entries (those with a `loss`) as columns, the evaluations as columns, the run's scalars."""

    source: Path | None  # the trainer_state.json read
    step: np.ndarray  # int64
    epoch: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    grad_norm_logged: np.ndarray  # bool
    learning_rate: np.ndarray
    learning_rate_logged: np.ndarray  # bool
    eval_step: np.ndarray
    eval_loss: np.ndarray
    eval_metrics: dict[str, np.ndarray]  # every other eval_* key, NaN where an evaluation did not log it
    metrics: Mapping[str, np.ndarray]  # every other numeric key of the train entries (trl's `rewards/margins`,
    #                                 `frac_reward_zero_std`, ...), NaN where an entry did not log it
    train_loss: float | None  # the summary entry's mean over all steps
    state: dict[str, Any]  # the scalars of trainer_state.json (global_step, max_steps, best_model_checkpoint, ...)

    @property
    def entries(self) -> int:
        return len(self.step)

    @property
    def global_step(self) -> int:
        return int(self.state.get("global_step") or (self.step[-1] if len(self.step) else 0))

    @property
    def max_steps(self) -> int | None:
        value = self.state.get("max_steps")
        return int(value) if value else None


def _columns(entries: list[dict[str, Any]], keys: tuple[str, ...]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The keys of every entry as float columns (a missing key or a null: NaN), one pass over the entries per key,
    and per key a mask of the entries that logged it (looked up only where the column is NaN)."""
    columns, logged = [], {}
    for key in keys:
        values = [e.get(key) for e in entries]
        try:
            column = np.array(values, dtype=float)  # None -> NaN
        except (TypeError, ValueError):  # a string where a number belongs: NaN there, the rest kept
            column = np.array([v if isinstance(v, (int, float)) else None for v in values], dtype=float)
        mask = np.ones(len(values), dtype=bool)
        for j in np.flatnonzero(np.isnan(column)):
            mask[j] = values[j] is not None
        columns.append(column.reshape(len(values)))
        logged[key] = mask
    table = np.column_stack(columns) if columns else np.empty((len(entries), 0))
    return table.reshape(len(entries), len(keys)), logged


def training_log(state: dict[str, Any], source: Path | None = None) -> TrainingLog:
    """The columns of a parsed trainer_state.json: each column is one pass over the entries (linear in them)."""
    history = state.get("log_history") or []
    train = [e for e in history if "loss" in e]
    evals = [e for e in history if "loss" not in e and "eval_loss" in e]
    summary = [e for e in history if "train_loss" in e and "loss" not in e]
    columns, logged = _columns(train, _TRAIN_KEYS)
    column = dict(zip(_TRAIN_KEYS, columns.T))
    metrics = MetricColumns(train)
    eval_keys = ("step", "eval_loss") + tuple(sorted({k for e in evals for k in e if k.startswith("eval_")}
                                                     - _EVAL_TIMING - {"eval_loss"}))
    eval_columns = dict(zip(eval_keys, _columns(evals, eval_keys)[0].T))
    train_loss = summary[-1].get("train_loss") if summary else None
    return TrainingLog(
        source=source, step=np.nan_to_num(column["step"]).astype(np.int64), epoch=column["epoch"],
        loss=column["loss"], grad_norm=column["grad_norm"], grad_norm_logged=logged["grad_norm"],
        learning_rate=column["learning_rate"], learning_rate_logged=logged["learning_rate"],
        eval_step=np.nan_to_num(eval_columns.pop("step")).astype(np.int64), eval_loss=eval_columns.pop("eval_loss"),
        eval_metrics=eval_columns, metrics=metrics, train_loss=float(train_loss) if isinstance(train_loss, (int, float)) else None,
        state={k: v for k, v in state.items() if k != "log_history"})


class MetricColumns(Mapping[str, np.ndarray]):
    """The train entries' other numeric keys as float columns, each built on first use (one pass over the entries)
    and kept: a judge reads a handful of a GRPO log's thirty keys. The keys are those of the first and last entries
    (`_SAMPLE` each: a metric logged from some step on is seen at the end)."""

    def __init__(self, train: list[dict[str, Any]]) -> None:
        sample = train[:_SAMPLE] + train[-_SAMPLE:]
        self._keys = sorted({k for e in sample for k, v in e.items()
                             if k not in _TRAIN_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)})
        self._train = train
        self._built: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._built:
            if key not in self._keys:
                raise KeyError(key)
            nan = float("nan")
            values = [e.get(key, nan) for e in self._train]
            try:
                self._built[key] = np.array(values, dtype=float)
            except (TypeError, ValueError):  # a null or a string in the column: NaN there
                self._built[key] = np.array([v if isinstance(v, (int, float)) else nan for v in values], dtype=float)
        return self._built[key]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def read_state(path: Path) -> dict[str, Any]:
    """trainer_state.json parsed: by orjson (3× faster than json on a long log), and by Python's json when the file
    holds the NaN or Infinity the Trainer writes for a non-finite value, which orjson refuses as not JSON."""
    data = Path(path).read_bytes()
    try:
        import orjson
    except ImportError:
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def read_training_log(path: Path) -> TrainingLog:
    return training_log(read_state(path), source=Path(path))


@dataclasses.dataclass(frozen=True)
class Mark:
    """An anomaly to mark on the curves: the series it sits on, its steps, a short label."""

    series: str  # "loss" | "grad_norm" | "learning_rate" | "eval_loss"
    steps: tuple[int, ...]
    label: str


def steps_text(steps, limit: int = 6) -> str:
    """'8, 9, 10, 11, 12, 13 … 16 (9 steps)': the steps a finding rests on, named."""
    steps = [int(s) for s in steps]
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    return ", ".join(map(str, steps[:limit])) + f" … {steps[-1]} ({len(steps)} steps)"
