"""A run's TensorBoard events (`report_to="tensorboard"`) read back into log_history entries, so that the run is
judged as far as it logged — past its last checkpoint when it was killed before the next save.

transformers' `TensorBoardCallback.on_log` writes every numeric log value with `add_scalar(key, value,
global_step)` after `rewrite_logs` (integrations/integration_utils.py, 5.23): `eval_x` → `eval/x`, `test_x` →
`test/x`, anything else → `train/x` (trl's `rewards/margins` → `train/rewards/margins`). The event files are read
with tensorboard's own `EventAccumulator`, every scalar kept (size guidance 0). Each launch writes its own folder
(runs/<date>_<host>): the newest is read, with the launches it resumed.
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


def launches(files: list[Path]) -> list[list[Path]]:
    """The event files grouped by folder (the Trainer's logging_dir is one folder per launch: runs/<date>_<host>),
    oldest launch first (by its first file's name, which carries the creation time)."""
    by_folder: dict[Path, list[Path]] = {}
    for path in files:
        by_folder.setdefault(path.parent, []).append(path)
    return sorted(by_folder.values(), key=lambda group: (min(p.name for p in group), str(group[0])))


def _steps(entries: list[dict[str, Any]]) -> list[int]:
    return [e["step"] for e in entries if "loss" in e]


def tensorboard_state(run_dir: Path, max_steps: int | None = None) -> tuple[dict[str, Any], list[Path]] | None:
    """A trainer_state-like dict (`log_history`, `global_step`) from the run's TensorBoard events, and the files
    read; None when there are none, tensorboard is not installed, or the events log past `max_steps` (another
    run's). The newest launch is read, with the earlier launches it resumed (one that started before it and
    reached its first step; the later launch wins the steps both logged): an older, longer launch into the same
    output_dir that it did not resume is not this run."""
    files = event_files(run_dir)
    if not files:
        return None
    try:
        groups = [(group, read_events(group)) for group in launches(files)]
    except ImportError:
        return None
    chain = [groups[-1]]
    for group in reversed(groups[:-1]):
        earlier, later = _steps(group[1]), _steps(chain[0][1])
        if earlier and later and min(earlier) < min(later) <= max(earlier) + 1:  # resumed: it went on from here
            start = min(later)  # the later launch wins the steps both logged (it resumed from a checkpoint)
            chain.insert(0, (group[0], [e for e in group[1] if e["step"] < start]))
        else:
            break
    entries = [e for _, found in chain for e in found]
    steps = _steps(entries)
    if not steps or (max_steps and max(steps) > max_steps):
        return None
    return {"log_history": entries, "global_step": max(steps)}, [p for group, _ in chain for p in group]
