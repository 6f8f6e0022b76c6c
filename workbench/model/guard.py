"""Probes share one prepared model; a probe that changes it must leave it as the set-up returned it.

    with restored(prepared.model):      # a training step, a simulated FSDP cast, a Trainer wrap ...
        probe(prepared, target)
    model_fingerprint(model)            # what "as the set-up returned it" means, comparable before and after

`restored` keeps the tensor objects themselves (not copies: no memory cost, no precision lost by casting back), the
requires_grad flags, every module's train/eval mode, and clears gradients. One change is not a tensor swap:
bitsandbytes repacks a 4-bit weight for its CPU inference kernel during an eval forward without grad (see
`workbench.model.bnb_cpu_layout`, which keeps the models we prepare from doing so); a model prepared elsewhere is
put back in the training layout on entry and on exit, with bitsandbytes' own inverse.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from workbench.model.bnb_cpu_layout import unpack_cpu_inference


def model_fingerprint(model) -> dict[str, tuple]:
    """Per parameter and buffer: dtype, device, shape, requires_grad, and the identity of its storage; per module:
    train mode. Equal fingerprints mean no probe swapped, cast, froze, unfroze or moved anything."""
    out: dict[str, tuple] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[f"param:{name}"] = (str(p.dtype), str(p.device), tuple(p.shape), p.requires_grad, _storage(p))
    for name, b in model.named_buffers(remove_duplicate=False):
        out[f"buffer:{name}"] = (str(b.dtype), str(b.device), tuple(b.shape), _storage(b))
    for name, m in model.named_modules(remove_duplicate=False):
        out[f"module:{name}"] = (m.training,)
    return out


def _storage(t) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # meta tensors have no storage
        return id(t)


@contextlib.contextmanager
def restored(model) -> Iterator[None]:
    """Run the block, then put back every parameter's and buffer's tensor, requires_grad and train mode."""
    unpack_cpu_inference(model)  # record the training layout, whatever an earlier unguarded forward did
    params = [(p, p.data, p.requires_grad) for p in _unique(model.parameters())]
    buffers = [(m, name, b) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        unpack_cpu_inference(model)
        for p, data, requires_grad in params:
            if p.data is not data:
                p.data = data
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
            p.grad = None
        for m, name, b in buffers:
            m._buffers[name] = b
        for m, training in modes:
            m.training = training


def _unique(tensors):
    seen: set[int] = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t

