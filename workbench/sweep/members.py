"""The members of a sweep: the folders the user named, or (`--history`) one Trainer output_dir's checkpoint-N
folders in step order. Bad input is refused here with one line naming the fix (exit 2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from workbench.errors import UsageError
from workbench.model.lora import read_json
from workbench.model.target import CHECKPOINT_FOLDER


@dataclasses.dataclass(frozen=True)
class Member:
    name: str  # unique within the sweep, usable as a folder name: its report is <sweep>/members/<name>/
    path: Path  # the folder diagnosed, absolute
    step: int | None = None  # a history's checkpoint step


def sweep_members(paths: list[str]) -> list[Member]:
    """Each PATH a member, in the order given; names from the folders (a repeated name gets its parent's)."""
    if not paths:
        raise UsageError("an empty sweep: name the checkpoints, adapters or Trainer output_dirs to compare "
                         "(`workbench sweep RUN_A RUN_B`), or one output_dir with --history")
    folders = []
    for given in paths:
        folder = Path(given).expanduser()
        if not folder.is_dir():
            raise UsageError(f"{given}: no such folder; a sweep's members are checkpoint, adapter or Trainer "
                             "output_dir folders")
        folders.append(folder.resolve())
    if len(set(folders)) < len(folders):
        raise UsageError("a folder is named twice in the sweep; name each member once")
    return [Member(name, folder) for name, folder in zip(_unique_names(folders), folders)]


def history_members(paths: list[str]) -> list[Member]:
    """One output_dir's checkpoint-N folders, by step, each checked to train on the same base."""
    if len(paths) != 1:
        raise UsageError(f"--history takes one Trainer output_dir, not {len(paths)} paths; without --history "
                         "the paths are compared side by side")
    run_dir = Path(paths[0]).expanduser()
    if not run_dir.is_dir():
        raise UsageError(f"{paths[0]}: no such folder; --history takes a Trainer output_dir")
    steps = sorted((int(m.group(1)), child) for child in run_dir.iterdir()
                   if child.is_dir() and (m := CHECKPOINT_FOLDER.match(child.name)))
    if not steps:
        raise UsageError(f"--history: {paths[0]} holds no checkpoint-N folder; pass the Trainer's output_dir "
                         "(save_strategy other than 'no'), or compare folders without --history")
    members = [Member(folder.name, folder.resolve(), step) for step, folder in steps]
    check_one_base(members)
    return members


def base_of(folder: Path) -> str:
    """What a checkpoint trains on: an adapter's recorded base, else the model's architecture and shape."""
    adapter = read_json(folder / "adapter_config.json")
    if adapter is not None:
        base = str(adapter.get("base_model_name_or_path") or "?")
        local = (folder / base) if not Path(base).is_absolute() else Path(base)
        return f"adapter on {local.resolve() if local.is_dir() else base}"
    config = read_json(folder / "config.json")
    if config is None:
        return "no config.json or adapter_config.json"
    shape = {k: config.get(k) for k in ("model_type", "architectures", "hidden_size", "num_hidden_layers")}
    return "model " + json.dumps(shape, sort_keys=True)


def check_one_base(members: list[Member]) -> None:
    """A history compares one run's saves: every checkpoint on one base (an adapter's base, or one architecture)."""
    first = base_of(members[0].path)
    for member in members[1:]:
        other = base_of(member.path)
        if other != first:
            raise UsageError(f"--history: {member.name} is {other}, {members[0].name} is {first}: a history "
                             "compares one run on one base; compare different runs without --history")


def _unique_names(folders: list[Path]) -> list[str]:
    names = [f.name for f in folders]
    names = [f"{f.parent.name}-{f.name}" if names.count(f.name) > 1 else f.name for f in folders]
    return [f"{name}-{i}" if names.count(name) > 1 else name for i, name in enumerate(names, 1)]

