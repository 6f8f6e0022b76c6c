"""One prepared model per process, shared by every notebook and panel step that asks for the same target.

The notebooks of one diagnosis run in one kernel, and `prepare_shared(target)` returns the model the set-up
prepared the first time, for as long as the target's options stay the same. Probes that change the model run under `workbench.model.guard.restored`, so each
one sees it as the set-up returned it. A new target frees the old model first (never two resident).
"""

from __future__ import annotations

import json
import os

_SHARED: dict[str, object] = {}
# A model too big for two copies is never resident twice, so a step that loads its own copy (notebook 03's
# wrapping chain) would free the shared model and have the next notebook prepare it again: one load more. When the
# runner says which notebooks this diagnosis runs (NOTEBOOKS_ENV), the first prepare runs those own-copy steps first
# and keeps their results here for their notebook (`take_early_result`).
NOTEBOOKS_ENV = "WORKBENCH_NOTEBOOKS"
_EARLY: dict[tuple[str, str], object] = {}  # (target key, probe) -> result, computed before the shared model
_OWN_COPY_DONE: set[tuple[str, str]] = set()  # own-copy steps already run for a target in this process


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
    _run_own_copy_steps_first(target, key)
    loads_before = len(LOADS)
    prepared = prepare_model(target)
    if len(LOADS) == loads_before:  # a set-up of the user's that called from_pretrained itself
        LOADS.append({"folder": str(target.model_dir), "quant": target.quant, "seconds": None,
                      "by": f"set-up {target.setup}", "why": "the model the set-up prepares"})
    _SHARED[key] = prepared
    return prepared


def loads_own_copy(step, target) -> bool:
    """Whether a catalog step marked `own_model` (notebook 03's wrapping chain) loads a copy of its own for this
    target: not where it walks a copy of the shared model's module tree (`module_tree.why_the_chain_loads`)."""
    from workbench.model.module_tree import why_the_chain_loads

    return step.own_model and why_the_chain_loads(target) is not None


def _own_copy_steps_ahead(target, key: str) -> list:
    """The own-copy steps (catalog `own_model`, taking only the target) of the notebooks this diagnosis runs that
    have not run yet for this target."""
    from workbench.catalog import NOTEBOOKS

    names = set(filter(None, os.environ.get(NOTEBOOKS_ENV, "").split(",")))
    return [step for spec in NOTEBOOKS if spec.name in names for step in spec.steps
            if loads_own_copy(step, target) and tuple(step.args) == ("target",) and not step.kwargs
            and (key, step.probe) not in _OWN_COPY_DONE]


def _run_own_copy_steps_first(target, key: str) -> None:
    from workbench.model.memory import two_copies_fit_easily

    steps = _own_copy_steps_ahead(target, key)
    if not steps or two_copies_fit_easily(target):
        return
    for step in steps:
        try:
            _EARLY[(key, step.probe)] = step.function()(target)
        except Exception:  # noqa: BLE001 - it runs again in its own notebook, where its error is recorded
            pass
        _OWN_COPY_DONE.add((key, step.probe))


def take_early_result(target, probe: str) -> object | None:
    """Called by a notebook as it runs an own-copy step: that step's early result if there is one (it is handed
    over once), else None — and either way the step counts as run for this target."""
    key = _key(target)
    _OWN_COPY_DONE.add((key, probe))
    return _EARLY.pop((key, probe), None)


def make_room_for_a_copy(target) -> None:
    """Before a probe loads its own copy of the model (the wrapping chain, the evaluation's recipes): free the
    shared one unless two copies fit easily. Small models keep it (one load saved); big ones are never resident
    twice (the shared model is prepared again when a later step asks for it)."""
    from workbench.model.memory import two_copies_fit_easily

    if _SHARED and not two_copies_fit_easily(target):
        free_shared()


def shared_if_prepared(target):
    """The target's prepared model if it is resident, else None (nothing is loaded)."""
    return _SHARED.get(_key(target))


def reset() -> None:
    """Forget everything this process cached for diagnoses: the shared model, early results, which own-copy steps
    ran (isolated tests; a new diagnosis in a long-lived kernel)."""
    if _SHARED or _EARLY:  # a collection only when something was held: tests call this after every test
        _EARLY.clear()
        free_shared()
    _OWN_COPY_DONE.clear()


def free_shared() -> None:
    """Drop the shared model (gc, and the CUDA cache where there is one)."""
    from workbench.model.memory import free_memory

    _SHARED.clear()
    free_memory()
