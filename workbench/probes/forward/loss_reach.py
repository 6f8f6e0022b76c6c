"""How each trainable tensor reaches the loss in one forward, traced op by op.

Autograd says whether a tensor got a gradient; this says why not. Every torch call of the forward (a
`TorchFunctionMode`) passes on, to the tensors it returns, the set of trainable tensors their values depend on:
through any chain (`through_any`), and through floating-point tensors only (`through_floating`). An integer or
boolean result (top-k or argmax indices, a comparison) carries the first and drops the second. Where a floating input
that requires grad gives a floating output that does not (`.detach()`, `.data`, an op under `torch.no_grad`), the
tensors behind it are cut from autograd: the site is recorded with the first frame outside torch that made the call.
Every tensor a traced op returns is marked, with an empty set when it depends on no trainable tensor; a module
output left unmarked, which no traced op produced (an `autograd.Function`'s, reentrant checkpointing's), carries what
the module read: its inputs and the trainable tensors it holds.

A trainable tensor that gets no gradient is then one of:
- never read by this forward, or read into values the loss never sees (`not_on_loss`);
- read into the loss only through integer/boolean values: a routing or index selection (`selection_only`);
- read into the loss through floating values cut at a recorded site (`cut`).
An embedding table looked up only at its padding_idx row gets a zero gradient by nn.Embedding's contract
(`padding_only`).
Values that depend on a tensor only through its shape or dtype (`zeros_like`, `new_zeros`, the `other` of `type_as`
or `to`) do not carry it, and neither does an empty tensor (a slice to zero elements, as a compressor's window slice
of a batch shorter than its window): it holds no value for the loss to read.
A cut is laid to gradient checkpointing only inside reentrant checkpointing's own no-grad forward
(`CheckpointFunction.forward`); the non-reentrant kind records the graph, so a cut under it is the code's own.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_CHECKPOINT_FILE = os.path.join(_TORCH_DIR, "utils", "checkpoint.py")
# reentrant checkpointing runs the checkpointed function here under torch.no_grad (torch/utils/checkpoint.py,
# `with torch.no_grad(): outputs = run_function(*args)`); the non-reentrant path records the graph
_REENTRANT_FORWARD = "CheckpointFunction.forward"
_NO_REACH = (0, 0)
_ATTRIBUTE = "_workbench_loss_reach"


def _is_shape_only(func: Any) -> bool:
    """Ops whose result depends on an input's shape, dtype and device, never on its values."""
    name = getattr(func, "__name__", "")
    return name.endswith("_like") or name.startswith("new_")


def _value_arguments(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors whose values the result is computed from: for `x.type_as(other)`, `x.to(other)`, `x.view_as(other)`
    only `x`."""
    name = getattr(func, "__name__", "")
    if (name.endswith("_as") or name == "to") and args and isinstance(args[0], torch.Tensor):
        return [args[0]]
    return [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]


def _padding_only_lookup(func: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, int] | None:
    """`(weight, padding_idx)` for an embedding lookup (`F.embedding`, what nn.Embedding calls) that reads only its
    table's padding_idx row: nn.Embedding's backward leaves that row's gradient at zero by contract."""
    if func is not torch.nn.functional.embedding:
        return None
    names = ("input", "weight", "padding_idx")
    bound = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
    ids, weight, padding_idx = bound.get("input"), bound.get("weight"), bound.get("padding_idx")
    if not isinstance(weight, torch.Tensor) or not isinstance(ids, torch.Tensor) or padding_idx is None:
        return None
    padding_idx = padding_idx + weight.size(0) if padding_idx < 0 else padding_idx
    return (weight, padding_idx) if ids.numel() and bool((ids == padding_idx).all()) else None


def _writes_first_argument(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))


@dataclasses.dataclass(frozen=True)
class CutSite:
    """Where grad-carrying values became values without grad."""

    where: str  # file:line in function, the first frame outside torch
    kind: str  # checkpoint | library | code
    library_file: str | None = None  # the installed library's source file, for `library`

    def describe(self) -> str:
        if self.kind == "checkpoint":
            return f"inside torch.utils.checkpoint (called from {self.where})"
        return self.where


def library_of(filename: str) -> str | None:
    """The installed transformers' own source file, relative to its package (`models/marian/modeling_marian.py`)."""
    import transformers

    root = os.path.dirname(os.path.abspath(transformers.__file__)) + os.sep
    path = os.path.abspath(filename)
    return "transformers/" + path[len(root):] if path.startswith(root) else None


def caller_site() -> CutSite:
    """The first frame outside torch and this tracing that called the op being handled (called from a
    `__torch_function__`)."""
    frame = sys._getframe(2)
    in_checkpoint = False
    first = None
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename == _CHECKPOINT_FILE and frame.f_code.co_qualname == _REENTRANT_FORWARD:
            in_checkpoint = True
        if first is None and not filename.startswith(_TORCH_DIR) and filename != _THIS_FILE:
            first = frame
        frame = frame.f_back
    if first is None:
        return CutSite("torch", "checkpoint" if in_checkpoint else "code")
    library = library_of(first.f_code.co_filename)
    where = f"{library or first.f_code.co_filename}:{first.f_lineno} in {first.f_code.co_name}"
    kind = "checkpoint" if in_checkpoint else "library" if library else "code"
    return CutSite(where, kind, library)


class LossReachTracer(TorchFunctionMode):
    """Traces one forward; `reach_of(loss)` then says how each trainable tensor reaches it."""

    def __init__(self, names: dict[int, str]):  # id(parameter) -> name, trainable tensors only
        super().__init__()
        self._bit = {key: 1 << index for index, key in enumerate(names)}
        self.names = [names[key] for key in names]
        self.read = 0
        self.read_beyond_padding = 0  # read by an op other than a lookup of only their padding_idx row
        self.padding_idx: dict[int, int] = {}  # bit -> padding_idx, for tables looked up at that row only
        self.cut = 0
        self.cut_sites: list[tuple[int, CutSite]] = []

    def __enter__(self):
        self._module_hook = torch.nn.modules.module.register_module_forward_hook(self._module_output)
        return super().__enter__()

    def __exit__(self, *exc):
        self._module_hook.remove()
        return super().__exit__(*exc)

    def _module_output(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        """Outputs no traced op produced (an autograd.Function's, reentrant checkpointing's) carry what the module
        read: its positional inputs and every trainable tensor it holds."""
        outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and id(t) not in self._bit
                   and not hasattr(t, _ATTRIBUTE)]
        if not outputs:
            return
        through_any = through_floating = 0
        for tensor in [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]:
            reach_any, reach_floating = self._reach(tensor)
            through_any |= reach_any
            through_floating |= reach_floating if tensor.is_floating_point() else 0
        own = sum(self._bit.get(id(p), 0) for p in module.parameters())
        for tensor in outputs:
            floating = tensor.is_floating_point() or tensor.is_complex()
            setattr(tensor, _ATTRIBUTE, (through_any | own, (through_floating | own) if floating else 0))

    def _reach(self, tensor: torch.Tensor) -> tuple[int, int]:
        bit = self._bit.get(id(tensor))
        if bit is not None:
            return bit, bit
        return getattr(tensor, _ATTRIBUTE, (0, 0))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _is_shape_only(func):
            self._mark_untouched(out)
            return out
        inputs = _value_arguments(func, args, kwargs)
        through_any = through_floating = cut_here = 0
        for tensor in inputs:
            if not tensor.numel():  # an empty tensor holds no value to pass on
                continue
            reach_any, reach_floating = self._reach(tensor)
            through_any |= reach_any
            if tensor.is_floating_point() or tensor.is_complex():
                through_floating |= reach_floating
                if tensor.requires_grad:
                    cut_here |= reach_floating
        if not through_any:
            self._mark_untouched(out)
            return out
        direct = sum(self._bit.get(id(t), 0) for t in {id(t): t for t in inputs}.values())
        self.read |= direct
        padding = _padding_only_lookup(func, args, kwargs)
        if padding is not None and id(padding[0]) in self._bit:
            bit = self._bit[id(padding[0])]
            self.padding_idx[bit] = padding[1]
            direct &= ~bit
        self.read_beyond_padding |= direct
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if _writes_first_argument(func) and inputs and isinstance(args[0], torch.Tensor):
            outputs.append(args[0])
        for tensor in outputs:
            if id(tensor) in self._bit:
                continue
            floating = tensor.is_floating_point() or tensor.is_complex()
            setattr(tensor, _ATTRIBUTE, (through_any, through_floating if floating else 0))
            if floating and cut_here and not tensor.requires_grad:
                new = cut_here & ~self.cut
                if new:
                    self.cut |= new
                    self.cut_sites.append((new, caller_site()))
        return out

    def _mark_untouched(self, out: Any) -> None:
        """Marks the tensors an op returned as carrying no trainable tensor, so that a module returning them is not
        taken for one whose output no traced op produced. A tensor already marked (an in-place op's) keeps its mark."""
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in self._bit and not hasattr(tensor, _ATTRIBUTE):
                setattr(tensor, _ATTRIBUTE, _NO_REACH)

    def reach_of(self, loss: torch.Tensor) -> LossReach:
        through_any, through_floating = self._reach(loss)
        padding_only = {self.names[bit.bit_length() - 1]: index for bit, index in self.padding_idx.items()
                        if not self.read_beyond_padding & bit}
        return LossReach(self.names, self.read, through_any, through_floating, self.cut_sites, padding_only)


@dataclasses.dataclass
class LossReach:
    names: list[str]
    read: int
    through_any: int
    through_floating: int
    cut_sites: list[tuple[int, CutSite]]
    padding_only: dict[str, int] = dataclasses.field(default_factory=dict)  # table -> the padding_idx, the only
    #                                                                         row this forward read

    def __post_init__(self):
        self._bits = {name: 1 << index for index, name in enumerate(self.names)}

    def why_no_gradient(self, name: str) -> tuple[str, CutSite | None]:
        """`never_read` | `not_on_loss` | `selection_only` | `cut` (with its site) | `untraced`."""
        bit = self._bits.get(name)
        if bit is None:
            return "untraced", None
        if not self.read & bit:
            return "never_read", None
        if not self.through_any & bit:
            return "not_on_loss", None
        if not self.through_floating & bit:
            return "selection_only", None
        return "cut", next((site for mask, site in self.cut_sites if mask & bit), None)


def trainable_names(named_parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[int, str]:
    return {id(p): name for name, p in named_parameters if p.requires_grad}
