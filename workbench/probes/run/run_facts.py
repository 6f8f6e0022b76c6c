"""What the checks of a run need besides its log: which trainer_state.json holds the longest log, the checkpoints,
the head and its number of classes (config.json), and the run's configuration as the model card records it, or as
training_args.bin holds it when the user allows unpickling it (`--allow-pickle`).

`run_directory(target)` is notebook 08's first step: the Trainer output_dir, or NotApplicable (every check skips).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from workbench.errors import NotApplicable
from workbench.model.run_configuration import RunConfiguration, run_configuration
from workbench.probes.run.run_kind import RunKind


def run_directory(target) -> Path:
    """The Trainer output_dir the target is or sits in; NotApplicable when it is no Trainer output."""
    run = getattr(target, "run", None)
    if run is None:
        raise NotApplicable(f"{target.checkpoint} is not a Trainer output directory (no trainer_state.json at its "
                            "root or in a checkpoint-N folder)", "not a Trainer output directory")
    return run.run_dir


def checkpoint_folders(run_dir: Path) -> dict[int, Path]:
    """step -> checkpoint-N folder, ascending."""
    from workbench.model.target import CHECKPOINT_FOLDER

    found = {}
    for child in run_dir.iterdir():
        match = CHECKPOINT_FOLDER.match(child.name)
        if match and child.is_dir():
            found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def longest_state(run_dir: Path) -> Path | None:
    """The trainer_state.json with the highest global_step: the root's (`trainer.save_state()`) or a checkpoint's."""
    candidates = [run_dir / "trainer_state.json"] + [f / "trainer_state.json" for f in checkpoint_folders(run_dir).values()]
    best, best_step = None, -1
    for path in candidates:
        if not path.exists():
            continue
        try:
            step = recorded_global_step(path)
        except (OSError, ValueError, TypeError):
            continue
        if step > best_step:  # a tie: the root's (save_state at the end) is listed first
            best, best_step = path, step
    return best


_GLOBAL_STEP = re.compile(r'"global_step":\s*(\d+)')


def recorded_global_step(path: Path) -> int:
    """global_step of a trainer_state.json. The Trainer writes its keys sorted (TrainerState.save_to_json:
    `json.dumps(..., sort_keys=True)`), so it precedes log_history: the file's head is enough."""
    with path.open() as handle:
        head = handle.read(4096)
    match = _GLOBAL_STEP.search(head)
    if match:
        return int(match.group(1))
    return int(json.loads(path.read_text()).get("global_step") or 0)


@dataclasses.dataclass(frozen=True)
class HeadClasses:
    """The expected loss of a fresh head, ln(classes): the vocabulary of an LM, num_labels of a classifier."""

    kind: str  # "language model" | "sequence classification" | "token classification"
    classes: int
    source: str  # e.g. "vocab_size in config.json"

    @property
    def expected_initial_loss(self) -> float:
        return math.log(self.classes)


def head_classes(config: dict[str, Any]) -> HeadClasses | None:
    architectures = config.get("architectures") or []
    arch = architectures[0] if architectures else ""
    for suffix, kind in (("ForSequenceClassification", "sequence classification"),
                         ("ForTokenClassification", "token classification")):
        if arch.endswith(suffix):
            if config.get("problem_type") in ("regression", "multi_label_classification"):
                return None  # no softmax over classes: ln(classes) is not its initial loss
            labels = config.get("id2label") or {}
            # config.json omits a default num_labels; PretrainedConfig then has 2 (configuration_utils.py, 5.23)
            classes = len(labels) or int(config.get("num_labels") or 2)
            return HeadClasses(kind, classes, f"num_labels of {arch} in config.json") if classes > 1 else None
    if arch.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")):
        text = config.get("text_config") or {}
        vocab = config.get("vocab_size") or text.get("vocab_size")
        return HeadClasses("language model", int(vocab), f"vocab_size of {arch} in config.json") if vocab else None
    return None


@dataclasses.dataclass(frozen=True)
class RunFacts:
    run_dir: Path
    folder: Path  # the folder diagnosed
    state_path: Path  # the trainer_state.json read
    checkpoints: dict[int, Path]
    head: HeadClasses | None
    configuration: RunConfiguration
    training_args_unread: Path | None  # training_args.bin present but not unpickled (no --allow-pickle)
    kind: RunKind = RunKind("sft", (), "not read")  # which trainer wrote the run (`run_kind`, from the log's keys)

    def checkpoint_at_or_after(self, step: int) -> tuple[int, Path] | None:
        return next(((s, p) for s, p in self.checkpoints.items() if s >= step), None)

    def checkpoint_before(self, step: int) -> tuple[int, Path] | None:
        before = [(s, p) for s, p in self.checkpoints.items() if s < step]
        return before[-1] if before else None

    def name(self, path: Path) -> str:
        """A path as the user reads it: relative to the output_dir."""
        try:
            return str(path.relative_to(self.run_dir)) or "."
        except ValueError:
            return str(path)


def run_facts(run_dir: Path, target) -> RunFacts:
    state = longest_state(run_dir)
    if state is None:
        raise NotApplicable(f"{run_dir} holds no readable trainer_state.json", "no trainer_state.json")
    folder = getattr(getattr(target, "run", None), "folder", None) or run_dir
    config_path = Path(target.model_dir) / "config.json" if target is not None else folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        config = {}
    allow = bool(getattr(target, "allow_pickle", False))
    pickled = next((p for p in (folder / "training_args.bin", run_dir / "training_args.bin") if p.exists()), None)
    return RunFacts(run_dir, folder, state, checkpoint_folders(run_dir), head_classes(config),
                    run_configuration(run_dir, folder, allow), pickled if pickled and not allow else None)
