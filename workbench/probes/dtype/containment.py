"""Whether a tensor off the compute dtype reaches the activations, asked of the model rather than of a list.

Three questions, cheapest first:

- `returns_input_dtype`: a norm-like or `in_features` module, called on a tiny input of the compute dtype, hands
  the compute dtype back (Gemma 3's RMSNorm computes in fp32 and returns `output.type_as(x)`; bitsandbytes'
  Linear4bit casts its fp32 bias).
- `traced_containment`: in one eval forward of the diagnosis batch without autocast (the forward that accepted the
  batch, traced as it ran: `batch.remembered_tracer`), the module that holds the tensor returns the compute dtype
  whenever it is given it (Zamba's Mamba mixer uses `-torch.exp(A_log.float())` and returns bf16; CodeGen's
  attention computes with its fp32 `embed_positions` and casts back). A module that
  takes no floating input (a sinusoid table indexed by positions) is judged by the nearest module above it that
  does: the one consuming its output (Canary's decoder casts `pos_emb` to the embeddings' dtype).
- `class_built_dtypes`: the dtype the model's own class gives each buffer in a load of the compute dtype, built
  on the meta device as from_pretrained builds it: an fp32 table there is the class's choice, not the user's.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from workbench.model.batch import remembered_tracer
from workbench.model.dtypes import dtype_name
from workbench.model.forward import run_forward
from workbench.model.loading import default_dtype
from workbench.model.tracer import DtypeTracer


def returns_input_dtype(module: nn.Module, compute_dtype: torch.dtype) -> bool:
    """Whether a module hands back the dtype it is given whatever its own tensors' dtype, asked by calling it on a
    tiny input of the compute dtype. Only leaf-like modules whose input width is known are asked: norm-like ones
    (their parameters 1-D: Gemma 3's RMSNorm computes in fp32 and returns `output.type_as(x)`, Llama's returns
    `weight * x.to(input_dtype)`, fp32 for an fp32 weight) and layers with `in_features` (bitsandbytes' Linear4bit
    casts its fp32 bias to its compute dtype and returns `.to(inp_dtype)`; a plain fp32 Linear raises)."""
    own = [p for _, p in module.named_parameters(recurse=False)]
    if not own or len(own) != sum(1 for _ in module.parameters()):
        return False
    width = getattr(module, "in_features", None)
    if not isinstance(width, int):
        if any(p.dim() != 1 for p in own):
            return False
        width = own[0].shape[0]
    device = own[0].device
    if device.type == "meta":
        return False
    try:
        with torch.no_grad():
            out = module(torch.randn(1, 2, width, dtype=compute_dtype, device=device))
    except Exception:  # noqa: BLE001 - a module that cannot take a plain tensor: not known to be contained
        return False
    return isinstance(out, torch.Tensor) and out.dtype == compute_dtype


@dataclasses.dataclass(frozen=True)
class Containment:
    """What one traced forward says about the holder of an off-dtype tensor."""

    judged_by: str  # the module whose inputs and outputs were compared: the holder, or the one consuming its output
    contained: bool  # it returned the compute dtype on every call that received it

    def reason(self, holder: str, holder_type: str, compute: str, tensor_dtype: str) -> str:
        if self.judged_by == holder:
            return (f"contained: {holder_type} returned {compute} for {compute} inputs in a forward of the "
                    f"diagnosis batch, so its {tensor_dtype} tensor never reaches the activations")
        return (f"contained: {holder_type} takes no floating input; `{self.judged_by or '(model)'}`, which consumes "
                f"its output, returned {compute} for {compute} inputs in a forward of the diagnosis batch, so the "
                f"{tensor_dtype} tensor never reaches the activations")


@dataclasses.dataclass(frozen=True)
class TracedForward:
    """One eval forward of the diagnosis batch without autocast, read for the holders of off-dtype tensors."""

    reached: frozenset[str]  # module paths the forward called (up to where it raised)
    verdicts: dict[str, Containment]  # per holder it could judge; empty when the forward raised
    raised: bool
    ran: bool = True


NOT_TRACED = TracedForward(frozenset(), {}, False, ran=False)  # no batch, or nothing left to ask


def traced_containment(model: nn.Module, inputs: dict, compute_dtype: torch.dtype,
                       holders: set[str]) -> TracedForward:
    """For each module path in `holders` that the forward reached, whether it keeps its off-dtype tensor from the
    activations. A forward that raises judges nothing (nothing is known to be contained), but says what it
    reached."""
    name = dtype_name(compute_dtype)
    tracer, exc = remembered_tracer(model, inputs, "eval", "no autocast"), None  # the accepting forward's, traced
    if tracer is None:
        was_training = model.training
        model.eval()
        try:
            with DtypeTracer(model) as tracer:
                _out, exc = run_forward(model, inputs, "no autocast", compute_dtype)
        finally:
            model.train(was_training)
    called: set[str] = set()
    fed: set[str] = set()  # modules called with at least one floating tensor
    kept: dict[str, bool] = {}  # per module: every call given the compute dtype returned only the compute dtype
    for call in tracer.calls:
        called.add(call.path)
        if call.inputs:
            fed.add(call.path)
        if call.outputs and name in call.inputs:
            kept[call.path] = kept.get(call.path, True) and all(o == name for o in call.outputs)
    if exc is not None:
        return TracedForward(frozenset(called), {}, True)
    verdicts: dict[str, Containment] = {}
    for holder in holders & called:  # a module the batch never reached says nothing
        judge = holder
        while judge not in fed and judge:  # a table indexed by integer positions: its consumer decides
            judge = judge.rsplit(".", 1)[0] if "." in judge else ""
        if judge in kept:
            verdicts[holder] = Containment(judge, kept[judge])
    return TracedForward(frozenset(called), verdicts, False)


def class_built_dtypes(model: nn.Module, compute_dtype: torch.dtype) -> dict[str, torch.dtype]:
    """Buffer and parameter name -> dtype in the model's own class loaded in `compute_dtype`, on the meta device (no
    weight read; buffers the class computes at construction are computed; a parameter built with an explicit dtype
    keeps it). Empty when the class cannot be rebuilt here."""
    from accelerate import init_empty_weights

    config = getattr(model, "config", None)
    build = getattr(type(model), "_from_config", None)
    if config is None or build is None:
        return {}
    try:
        with default_dtype(compute_dtype), init_empty_weights():
            skeleton = build(copy.deepcopy(config), dtype=compute_dtype)
    except Exception:  # noqa: BLE001 - a class that does not rebuild from its config here: no class evidence
        return {}
    return {name: t.dtype for name, t in (*skeleton.named_buffers(), *skeleton.named_parameters())}
