"""One prepared model per process, shared by every notebook and panel step that asks for the same target.

A diagnosis used to load the model in every notebook's kernel; now the notebooks of one diagnosis run in one
kernel and `prepare_shared(target)` returns the model the set-up prepared the first time, for as long as the
target's options stay the same. Probes that change the model run under `workbench.model.guard.restored`, so each
one sees it as the set-up returned it. A new target frees the old model first (never two resident).
"""

from __future__ import annotations

import json

_SHARED: dict[str, object] = {}


def _key(target) -> str:
    return json.dumps(target.options(), sort_keys=True)


def prepare_shared(target):
    """The target's prepared model: prepared once, then the same object for every later step."""
    from workbench.model.loading import LOADS
    from workbench.model.setups import prepare_model

    key = _key(target)
    if key in _SHARED:
        return _SHARED[key]
    free_shared()
    loads_before = len(LOADS)
    prepared = prepare_model(target)
    if len(LOADS) == loads_before:  # a set-up of the user's that called from_pretrained itself
        LOADS.append({"folder": str(target.model_dir), "quant": target.quant, "seconds": None,
                      "by": f"set-up {target.setup}"})
    _SHARED[key] = prepared
    return prepared


def make_room_for_a_copy(target) -> None:
    """Before a probe loads its own copy of the model (the wrapping chain, the evaluation's recipes): free the
    shared one unless two copies fit easily. Small models keep it (one load saved); big ones are never resident
    twice (the shared model is prepared again when a later step asks for it)."""
    from workbench.resources import two_copies_fit_easily

    if _SHARED and not two_copies_fit_easily(target):
        free_shared()


def shared_if_prepared(target):
    """The target's prepared model if it is resident, else None (nothing is loaded)."""
    return _SHARED.get(_key(target))


def free_shared() -> None:
    """Drop the shared model (gc, and the CUDA cache where there is one)."""
    from workbench.resources import free_memory

    _SHARED.clear()
    free_memory()
