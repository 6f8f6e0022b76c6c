"""The full-model forwards a probe step runs, counted for the report's cost block (`recorder.run`).

    with counted_passes() as passes:
        grad_flow_probe(prepared, target)
    passes.forwards, passes.with_grad        # 1, 1: one training step's forward

A forward is a call of a module that carries a transformers `config` (a PreTrainedModel, or a PeftModel around one)
made while no other module's forward runs in that thread: the PeftModel around a model, and the model inside it,
are one forward; a DataParallel replica's thread counts its own. A part of a model that carries its own config,
run alone where the same block runs the whole model too (a VLM's vision tower asked how many image tokens a batch's
image makes), is a pass over that part only and not counted: at the block's end, a module with a config of its own
inside another module that was run is dropped. `with_grad` counts those run with autograd on,
which a backward follows in the probes (grad.flow, the Trainer's steps). Forwards of a model on the meta device
(the set-up predictions, the plan's skeleton) are not passes over weights and are left out, and so are those of a
probe's tiny stand-in for the model (`mark_stand_in`: the Trainer steps train.loss_accumulation runs on a shrunk
twin of a model too big to copy, a few milliseconds each, which the cost block had counted as five full-model
forwards at every size). Counted with torch's global module hooks
(`torch.nn.modules.module.register_module_forward_pre_hook`), removed when the block ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Iterator


@dataclasses.dataclass
class Passes:
    forwards: int = 0
    with_grad: int = 0


STAND_IN = "_workbench_stand_in"  # set on a probe's tiny stand-in for the model: its forwards are no passes


def mark_stand_in(module):
    """`module` (a shrunk twin of the model a probe runs in its place) marked: its forwards are not counted."""
    setattr(module, STAND_IN, True)
    return module


def _over_weights(module) -> bool:
    first = next(module.parameters(), None)
    return first is not None and first.device.type != "meta" and not getattr(module, STAND_IN, False)


@contextlib.contextmanager
def counted_passes() -> Iterator[Passes]:
    """Count the full-model forwards run inside the block; where torch has not been imported, nothing ran one."""
    passes = Passes()
    torch = sys.modules.get("torch")
    if torch is None:
        yield passes
        return
    depth = threading.local()

    ran: list[tuple[object, bool]] = []  # (module, with autograd), each top-level forward over weights

    def before(module, _args):
        level = getattr(depth, "level", 0)
        depth.level = level + 1
        if level == 0 and getattr(module, "config", None) is not None and _over_weights(module):
            ran.append((module, torch.is_grad_enabled()))
            passes.forwards += 1
            passes.with_grad += ran[-1][1]

    def after(_module, _args, _output):
        depth.level = getattr(depth, "level", 1) - 1

    from torch.nn.modules import module as torch_module

    handles = [torch_module.register_module_forward_pre_hook(before),
               torch_module.register_module_forward_hook(after, always_call=True)]
    try:
        yield passes
    finally:
        for handle in handles:
            handle.remove()
        _drop_parts_of_models_run(passes, ran)


def _drop_parts_of_models_run(passes: Passes, ran: list[tuple[object, bool]]) -> None:
    """Recount `passes` without the forwards of a module that sits inside another module run in the same block."""
    outer = {id(m): m for m, _ in ran}
    if len(outer) < 2:
        return
    # a part carries a config of its own (the vision sub-config); the model inside a PeftModel shares its wrapper's,
    # and running both is two passes over the same weights
    inside = {id(sub) for m in outer.values() for sub in m.modules()
              if sub is not m and getattr(sub, "config", None) is not getattr(m, "config", None)}
    kept = [grad for m, grad in ran if id(m) not in inside]
    passes.forwards, passes.with_grad = len(kept), sum(kept)
