"""The dtype tracer: which dtypes go into and come out of every module, through a failing call, in any thread.

transformers' `model_addition_debugger_context` traces forward-only under no_grad; this tracer hooks every module
(`register_forward_pre_hook` / `register_forward_hook(always_call=True)`), so it records in training mode, inside
DataParallel-style replica threads, and through the exception that ends the forward. Hooks are removed on exit,
whatever happened.

    with DtypeTracer(model) as tracer:
        model(**inputs)              # may raise
    tracer.diagnosis()               # "model.norm (weight float32) outputs float32 -> lm_head (bfloat16) raises"
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

import torch
from torch import nn

_NAMES: dict[torch.dtype, str] = {}


def _name(dtype: torch.dtype) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _floating_dtypes(values: Any) -> list[str]:
    """Floating dtypes of the tensors in (nested) args/kwargs/outputs, first seen first; 3 levels deep at most."""
    found: list[str] = []
    _collect(values, found, 0)
    return found


def _collect(v: Any, found: list[str], depth: int) -> None:
    if isinstance(v, torch.Tensor):
        if v.is_floating_point():
            name = _NAMES.get(v.dtype) or _name(v.dtype)
            if name not in found:
                found.append(name)
    elif depth < 3:
        kind = type(v)
        if kind is tuple or kind is list:
            for x in v:
                _collect(x, found, depth + 1)
        elif kind is dict:
            for x in v.values():
                _collect(x, found, depth + 1)
        elif hasattr(v, "to_tuple"):  # transformers ModelOutput
            _collect(v.to_tuple(), found, depth + 1)


def _weight_dtype(module: nn.Module) -> str | None:
    """The dtype a module computes in: bitsandbytes' compute_dtype, else its own floating weight's dtype."""
    compute = getattr(module, "compute_dtype", None)
    if isinstance(compute, torch.dtype):
        return str(compute).removeprefix("torch.")
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point:
        return str(weight.dtype).removeprefix("torch.")
    return None


@dataclasses.dataclass(slots=True)
class ModuleCall:
    index: int
    path: str
    module_type: str
    thread: str
    inputs: list[str]
    weight: str | None
    outputs: list[str] | None = None
    raised: bool = False
    casts_input: bool = False  # bitsandbytes layers cast their input to compute_dtype themselves

    @property
    def mismatch(self) -> bool:
        """A floating input whose dtype differs from the module's weight dtype (and that the module won't cast)."""
        return bool(self.weight and self.inputs and self.weight not in self.inputs[:1] and not self.casts_input)

    def as_row(self) -> dict[str, Any]:
        return {"#": self.index, "module": self.path or "(model)", "type": self.module_type,
                "in": ",".join(self.inputs), "weight": self.weight or "",
                "out": "raised" if self.raised else ",".join(self.outputs or []), "thread": self.thread}


class DtypeTracer:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[ModuleCall] = []
        self._open: dict[tuple[int, int], list[ModuleCall]] = {}
        self._handles: list[Any] = []
        self._counter = itertools.count()  # next() is atomic under the GIL: safe across replica threads

    def __enter__(self) -> DtypeTracer:
        for path, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post(), with_kwargs=True, always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre(self, path: str):
        module_type, weight, casts = None, None, False

        def hook(module, args, kwargs):
            nonlocal module_type, weight, casts
            if module_type is None:  # per-module facts, computed once
                module_type, weight = type(module).__name__, _weight_dtype(module)
                casts = isinstance(getattr(module, "compute_dtype", None), torch.dtype)
            call = ModuleCall(next(self._counter), path, module_type, threading.current_thread().name,
                              _floating_dtypes((args, kwargs)), weight, casts_input=casts)
            self.calls.append(call)  # list.append and dict.setdefault are atomic under the GIL
            self._open.setdefault((id(module), threading.get_ident()), []).append(call)
        return hook

    def _post(self):
        def hook(module, args, kwargs, output):
            stack = self._open.get((id(module), threading.get_ident()))
            if not stack:
                return
            call = stack.pop()
            if output is None:  # always_call: the forward raised (transformers modules never return None)
                call.raised = True
            else:
                call.outputs = _floating_dtypes(output)
        return hook

    # ----- reading the trace -----
    def failing_call(self) -> ModuleCall | None:
        """The innermost module that raised: the first call (in entry order) that raised and has no raising child."""
        raised = [c for c in self.calls if c.raised]
        return max(raised, key=lambda c: c.index) if raised else None

    def first_mismatch(self) -> ModuleCall | None:
        return next((c for c in self.calls if c.mismatch), None)

    def producer_of(self, call: ModuleCall) -> ModuleCall | None:
        """The last module, finished before `call` began, whose output carried `call`'s mismatched input dtype and
        that holds a weight of that dtype (or the last one that output it, if none holds such a weight)."""
        wanted = call.inputs[0] if call.inputs else None
        before = [c for c in self.calls if c.index < call.index and c.outputs and c.thread == call.thread
                  and wanted in c.outputs and not call.path.startswith(c.path + ".") and c.path != ""]
        holders = [c for c in before if c.weight == wanted]
        pool = holders or before
        return pool[-1] if pool else None

    def diagnosis(self) -> dict[str, Any] | None:
        """The dtype break: the failing module if it received a mismatched dtype, else the first mismatch seen."""
        failing = self.failing_call()
        target = failing if failing is not None and failing.mismatch else self.first_mismatch()
        if target is None:
            return None
        producer = self.producer_of(target)
        action = "raises" if target is failing else "receives it"
        text = (f"`{producer.path}` (weight {producer.weight or '-'}) outputs {target.inputs[0]} → "
                if producer else "") + f"`{target.path}` (weight {target.weight}) {action}"
        return {"summary": text, "module": target.path, "module_weight": target.weight,
                "input_dtype": target.inputs[0], "raised": target is failing,
                "producer": producer.path if producer else None,
                "producer_weight": producer.weight if producer else None, "thread": target.thread}

    def flow(self, around: int = 6) -> list[dict[str, Any]]:
        """A compact chart: leaf calls near the break (or the whole leaf flow when nothing broke)."""
        leaves = [c for c in self.calls if c.weight is not None or c.raised]
        d = self.diagnosis()
        if d is None:
            return [c.as_row() for c in leaves[:40]]
        idx = next((i for i, c in enumerate(leaves) if c.path == d["module"]), len(leaves) - 1)
        rows = [c.as_row() for c in leaves[max(0, idx - around): idx + 2]]
        for row in rows:
            row["break"] = "◀ break" if row["module"] == d["module"] else (
                "◀ produced it" if row["module"] == d.get("producer") else "")
        return rows
