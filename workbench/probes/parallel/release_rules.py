"""How the Trainer's DataParallel decision moved across transformers releases, encoded for runs made elsewhere.

The installed release is never judged from this table: `trainer_wrap` observes the real Trainer. The table is for
a user whose failing run used another release. Each line was read from the released wheel's `trainer.py`
(`Trainer.__init__` model-parallel detection and `Trainer._wrap_model`); tests pin it against the installed
Trainer and against the facts read from those wheels (`tests/probes/parallel/test_release_rules.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from packaging.version import Version


@dataclasses.dataclass(frozen=True)
class TrainerReleaseLine:
    since: str
    guards_8bit: bool  # _wrap_model skips DataParallel for is_loaded_in_8bit
    guards_4bit: bool  # ... and for is_loaded_in_4bit
    multi_device_map_is_model_parallel: bool  # hf_device_map spanning >1 non-cpu/disk device
    one_device_map_vs_args_device: bool  # a one-device map counts as model parallel if != args.device
    honours_parallelizable_flags: bool  # is_parallelizable and model_parallel
    source: str


RELEASE_LINES: tuple[TrainerReleaseLine, ...] = (
    TrainerReleaseLine("4.27", False, False, False, False, True,
                       "4.27 trainer.py: _wrap_model wraps nn.DataParallel when args.n_gpu > 1; model parallel "
                       "only via is_parallelizable and model_parallel"),
    TrainerReleaseLine("4.28", True, False, True, False, True,
                       "4.28 trainer.py: `not getattr(model, 'is_loaded_in_8bit', False)` added to _wrap_model; an "
                       "hf_device_map with more than one non-cpu/disk device sets is_model_parallel"),
    TrainerReleaseLine("4.30", True, False, True, True, True,
                       "4.30 trainer.py: a one-device hf_device_map sets is_model_parallel when its device differs "
                       "from args.device (cuda:1 escapes DataParallel, cuda:0 does not)"),
    TrainerReleaseLine("5.0", True, False, True, True, False,
                       "5.0 trainer.py: the is_parallelizable / model_parallel branch is removed"),
    TrainerReleaseLine("5.6", True, True, True, True, False,
                       "5.6 trainer.py: `not getattr(model, 'is_loaded_in_4bit', False)` added beside the 8-bit guard"),
)


def release_line_for(version: str) -> TrainerReleaseLine | None:
    """The rules in force in `version` (None before the first encoded line)."""
    v = Version(Version(version).base_version)
    lines = [line for line in RELEASE_LINES if Version(line.since) <= v]
    return lines[-1] if lines else None


def _as_device(value: Any) -> str:
    if isinstance(value, int):
        return f"cuda:{value}"
    return "cuda:0" if value == "cuda" else str(value)


def decide(line: TrainerReleaseLine, *, n_gpu: int, hf_device_map: dict | None = None, is_loaded_in_4bit=False,
           is_loaded_in_8bit=False, is_parallelizable=False, model_parallel=False,
           args_device: str = "cuda:0") -> dict[str, Any]:
    """What `line`'s Trainer does with a model having these attributes, in a process seeing `n_gpu` GPUs."""
    is_mp = bool(line.honours_parallelizable_flags and is_parallelizable and model_parallel)
    if hf_device_map:
        devices = {_as_device(d) for d in hf_device_map.values() if d not in ("cpu", "disk")}
        if len(devices) > 1 and line.multi_device_map_is_model_parallel:
            is_mp = True
        elif len(devices) == 1 and line.one_device_map_vs_args_device:
            is_mp = is_mp or next(iter(devices)) != _as_device(args_device)
    effective = 1 if is_mp else n_gpu
    wraps = effective > 1 and not (line.guards_8bit and is_loaded_in_8bit) and not (line.guards_4bit and is_loaded_in_4bit)
    return {"release": line.since, "is_model_parallel": is_mp, "n_gpu": effective, "wraps_data_parallel": wraps}


def verdicts_across_releases(**attributes: Any) -> list[dict[str, Any]]:
    """One row per encoded release line: the decision it would take, and its citation."""
    return [{**decide(line, **attributes), "source": line.source} for line in RELEASE_LINES]
