"""A run's TensorBoard events (`report_to="tensorboard"`) read back into log_history entries, so that the run is
judged as far as it logged — past its last checkpoint when it was killed before the next save.

transformers' `TensorBoardCallback.on_log` writes every numeric log value with `add_scalar(key, value,
global_step)` after `rewrite_logs` (integrations/integration_utils.py, 5.23): `eval_x` → `eval/x`, `test_x` →
`test/x`, anything else → `train/x` (trl's `rewards/margins` → `train/rewards/margins`). The event files are read
with tensorboard's own `EventAccumulator`, every scalar kept (size guidance 0). A resumed run writes one file per
launch: the later file wins a step both hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EVENTS = "events.out.tfevents.*"
SUMMARY_KEYS = frozenset({"train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second",
                          "total_flos"})
MAX_DEPTH = 3  # output_dir/runs/<date_host>/events...: the Trainer's default logging_dir is two levels down


def event_files(run_dir: Path) -> list[Path]:
    """The run's event files outside its checkpoint-N folders, oldest first (by name: their timestamp)."""
    found = []
    for depth in range(MAX_DEPTH + 1):
        pattern = "/".join(["*"] * depth + [EVENTS])
        found += [p for p in Path(run_dir).glob(pattern)
                  if p.is_file() and not any(part.startswith("checkpoint-") for part in p.parts[-depth - 1:-1])]
    return sorted(set(found), key=lambda p: (p.name, str(p)))


def _key(tag: str) -> str:
    """The log_history key a TensorBoard tag came from (the inverse of transformers' `rewrite_logs`)."""
    if tag.startswith("eval/"):
        return "eval_" + tag[len("eval/"):]
    if tag.startswith("test/"):
        return "test_" + tag[len("test/"):]
    return tag[len("train/"):] if tag.startswith("train/") else tag


def read_events(files: list[Path]) -> list[dict[str, Any]]:
    """log_history entries rebuilt from the event files: per step one train entry (the keys logged with the loss)
    and one evaluation entry (`eval_*`), as the Trainer appends them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    by_step: dict[int, dict[str, float]] = {}
    for path in files:
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            key = _key(tag)
            for event in accumulator.Scalars(tag):
                by_step.setdefault(int(event.step), {})[key] = float(event.value)
    entries: list[dict[str, Any]] = []
    for step in sorted(by_step):
        values = by_step[step]
        evals = {k: v for k, v in values.items() if k.startswith(("eval_", "test_"))}
        summary = {k: v for k, v in values.items() if k in SUMMARY_KEYS}
        train = {k: v for k, v in values.items() if k not in evals and k not in summary}
        if "loss" in train:
            entries.append({"step": step, **train})
        if evals:
            entries.append({"step": step, **evals})
        if summary:
            entries.append({"step": step, **summary})  # the Trainer's last log call (`train_loss`, runtime)
    return entries


def tensorboard_state(run_dir: Path) -> tuple[dict[str, Any], list[Path]] | None:
    """A trainer_state-like dict (`log_history`, `global_step`) from the run's TensorBoard events, and the files
    read; None when there are none or tensorboard is not installed."""
    files = event_files(run_dir)
    if not files:
        return None
    try:
        entries = read_events(files)
    except ImportError:
        return None
    steps = [e["step"] for e in entries if "loss" in e]
    return {"log_history": entries, "global_step": max(steps, default=0)}, files
