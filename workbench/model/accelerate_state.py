"""accelerate's process-wide state, kept as the running training launched it.

Building any `TrainingArguments` clears accelerate's shared state (transformers 5.23 training_args.py:1872,
`AcceleratorState._reset_state(reset_partial_state=True)`), and the training-step checks build theirs; a live
Trainer's next step then raises "`AcceleratorState` object has no attribute `distributed_type`". The training
callback's pre-flight keeps the state as it found it (`kept_as_launched`) and puts it back at the end; a probe that
runs the live trainer's own code in between (train.rl_rollout) runs it under that state (`as_launched`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

_LAUNCHED: list[dict] | None = None  # the shared states as the pre-flight found them, while it runs


def shared_states() -> list[dict]:
    """accelerate's Borg dicts (accelerate 1.15 state.py: PartialState, AcceleratorState, GradientState share one
    `_shared_state` per class; each instance's __dict__ is that dict)."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    return [PartialState._shared_state, AcceleratorState._shared_state, GradientState._shared_state]


def _put(values: list[dict]) -> None:
    for state, kept in zip(shared_states(), values):  # in place: every live state object's __dict__ is this dict
        state.clear()
        state.update(kept)


@contextlib.contextmanager
def kept_as_launched() -> Iterator[None]:
    """The shared state as found on entry, published for `as_launched` inside and put back on exit."""
    global _LAUNCHED
    kept, outer = [dict(state) for state in shared_states()], _LAUNCHED
    _LAUNCHED = kept
    try:
        yield
    finally:
        _LAUNCHED = outer
        _put(kept)


@contextlib.contextmanager
def as_launched() -> Iterator[bool]:
    """Inside the pre-flight: the launch's state for the block, the current one back after it (yields True).
    Elsewhere: nothing changes (yields False)."""
    if _LAUNCHED is None:
        yield False
        return
    current = [dict(state) for state in shared_states()]
    _put(_LAUNCHED)
    try:
        yield True
    finally:
        _put(current)
