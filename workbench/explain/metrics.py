"""The Trainer's logged metrics as `workbench explain` keeps them, and the conditions on them that log symptoms and
`metrics` clues name (`when: loss_zero_grad_nan`)."""

from __future__ import annotations

import math
from typing import Any


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def _loss_zero_grad_nan(m: "LogMetrics") -> bool:
    return any(loss == 0.0 and math.isnan(g) for loss, g in m.paired("loss", "grad_norm"))


# Conditions on the Trainer's logged metrics that log symptoms and `metrics` clues name
LOG_CONDITIONS: dict[str, Any] = {
    "loss_zero_grad_nan": _loss_zero_grad_nan,  # a logged loss of exactly 0.0 where grad_norm is nan
    "loss_nan": lambda m: any(math.isnan(v) for v in m.series.get("loss", [])),
    "grad_norm_nan": lambda m: any(math.isnan(v) for v in m.series.get("grad_norm", [])),
    "eval_loss_nan": lambda m: any(math.isnan(v) for v in m.series.get("eval_loss", [])),
    # two or more logged losses of exactly 0.0 in a row, with finite gradient norms where they are logged
    "loss_zero": lambda m: m.zero_run("loss") >= 2 and not _loss_zero_grad_nan(m),
    "grad_norm_zero": lambda m: m.zero_run("grad_norm") >= 2,
    "learning_rate_zero": lambda m: bool(m.series.get("learning_rate")) and all(
        v == 0.0 for v in m.series["learning_rate"]),
    # the first logged loss far above ln(vocab) of any tokenizer: a sum where a mean is expected
    "loss_above_chance": lambda m: bool(_finite(m.series.get("loss", []))) and _finite(m.series["loss"])[0] > 25.0,
    "loss_flat": lambda m: len(_finite(m.series.get("loss", []))) >= 5 and (
        max(_finite(m.series["loss"])) - min(_finite(m.series["loss"]))) <= 1e-3 * max(
        1.0, abs(_finite(m.series["loss"])[0])),
}


METRIC_KEYS = ("loss", "grad_norm", "learning_rate", "eval_loss")  # what LOG_CONDITIONS read


class LogMetrics:
    """The Trainer's logged records (`{'loss': …, 'grad_norm': …}` lines, or trainer_state.json's log_history), kept
    as one column of floats per metric the conditions read (a 100 MB log's records in a few MB), and the
    (loss, grad_norm) pairs logged together."""

    def __init__(self) -> None:
        from array import array

        self.count = 0
        self.series: dict[str, Any] = {k: array("d") for k in METRIC_KEYS}
        self.loss_grad_pairs = (array("d"), array("d"))

    def add(self, record: dict[str, float]) -> None:
        kept = {k: v for k, v in record.items() if k in self.series}
        if not kept:
            return
        self.count += 1
        for k, v in kept.items():
            self.series[k].append(v)
        if "loss" in kept and "grad_norm" in kept:
            self.loss_grad_pairs[0].append(kept["loss"])
            self.loss_grad_pairs[1].append(kept["grad_norm"])

    def paired(self, a: str, b: str) -> list[tuple[float, float]]:
        if (a, b) != ("loss", "grad_norm"):
            raise KeyError(f"only (loss, grad_norm) pairs are kept, not ({a}, {b})")
        return list(zip(*self.loss_grad_pairs))

    def zero_run(self, key: str) -> int:
        best = run = 0
        for v in self.series.get(key, ()):
            run = run + 1 if v == 0.0 else 0
            best = max(best, run)
        return best

    def holds(self, condition: str) -> bool:
        return self.count > 0 and bool(LOG_CONDITIONS[condition](self))

    def summary(self) -> dict[str, Any]:
        """First and last value of each metric (a non-finite one as its name: JSON has no NaN), NaN and zero counts."""
        def shown(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)

        return {"records": self.count,
                **{k: {"first": shown(v[0]), "last": shown(v[-1]), "nan": sum(math.isnan(x) for x in v),
                       "zero": sum(x == 0.0 for x in v)} for k, v in self.series.items() if len(v)}}


