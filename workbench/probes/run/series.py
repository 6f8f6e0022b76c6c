"""Small readings of a logged metric column shared by the run judges: its finite values with their steps, the
median of its first and last fifth."""

from __future__ import annotations

import dataclasses

import numpy as np

from workbench.probes.run.trainer_state import TrainingLog


@dataclasses.dataclass(frozen=True)
class Series:
    key: str
    steps: np.ndarray
    values: np.ndarray  # finite values only

    def __len__(self) -> int:
        return len(self.values)

    @property
    def fifth(self) -> int:
        return max(1, len(self.values) // 5)

    @property
    def start(self) -> float:
        """Median of the first fifth."""
        return float(np.median(self.values[:self.fifth]))

    @property
    def end(self) -> float:
        """Median of the last fifth."""
        return float(np.median(self.values[-self.fifth:]))

    def span(self) -> str:
        return f"{self.key} {self.start:.4g} → {self.end:.4g} (median of the first and last fifth of {len(self)} " \
               f"logged steps)"


def series(log: TrainingLog, key: str) -> Series | None:
    """The finite values a run logged under `key` (trl's own metric keys), or None when it logged none."""
    column = log.metrics.get(key)
    if column is None:
        return None
    finite = np.isfinite(column)
    if not finite.any():
        return None
    return Series(key, log.step[finite], column[finite])
