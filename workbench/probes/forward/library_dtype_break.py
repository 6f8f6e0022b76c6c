"""A dtype break made by the library's own class, not by the user's checkpoint or set-up.

Two shapes, both read from the traced forward and the model itself, never from a list of families:

- **returns**: a module of a transformers class receives its first input (the hidden states) in the compute dtype,
  holds no floating parameter or buffer outside it, and still outputs float32: its own forward computes in fp32 and does not cast back (MRA's
  `MraSelfAttention` hands `query_layer.float()` … to `mra2_attention` and returns that).
- **builds**: the module that raises holds floating parameters outside the compute dtype, and `from_pretrained` with
  that dtype builds them so (the meta skeleton, built as from_pretrained builds it, has the same dtype under the same
  names) while the class does not declare them in `_keep_in_fp32_modules(_strict)`: the class's constructor fixes
  their dtype (XLNet's `nn.Parameter(torch.FloatTensor(...))` ignores `dtype=`).

    break_ = library_dtype_break(model, tracer, compute_dtype)   # dict (evidence) or None
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from workbench.model.components import unwrap_model
from workbench.model.dtypes import keep_in_fp32_matcher
from workbench.model.loading import meta_model
from workbench.model.tracer import DtypeTracer, ModuleCall


def _is_library_class(module: nn.Module) -> bool:
    return type(module).__module__.startswith("transformers.models.")


def _source_line(module: nn.Module, method: str = "forward") -> str:
    """`models/mra/modeling_mra.py:550 (MraSelfAttention.forward)`: where the class's method is written."""
    cls = type(module)
    function = getattr(cls, method)
    try:
        path = inspect.getsourcefile(function) or ""
        line = inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return f"{cls.__module__}.{cls.__name__}.{method}"
    return f"{path.rsplit('transformers/', 1)[-1]}:{line} ({cls.__name__}.{method})"


def _off_dtype(module: nn.Module, compute: torch.dtype, recurse: bool) -> list[tuple[str, torch.Tensor]]:
    tensors = [*module.named_parameters(recurse=recurse), *module.named_buffers(recurse=recurse)]
    return [(n, t) for n, t in tensors if t.is_floating_point() and t.dtype != compute]


def _returning_fp32(model: nn.Module, tracer: DtypeTracer, failing: ModuleCall,
                    compute: str) -> dict[str, Any] | None:
    """The library module nearest before the raise that turned compute-dtype inputs into the dtype the raising
    module received, with nothing of that dtype of its own (shape "returns")."""
    wanted = failing.inputs[0] if failing.inputs else None
    if wanted is None or wanted == compute:
        return None
    modules = dict(model.named_modules())
    before = [c for c in tracer.calls if c.index < failing.index and c.thread == failing.thread and c.outputs
              and c.outputs[0] == wanted and c.inputs[:1] == [compute] and c.path
              and not failing.path.startswith(c.path + ".")]
    for call in reversed(before):
        module = modules.get(call.path)
        if module is None or not _is_library_class(module):
            continue
        if _off_dtype(module, getattr(torch, compute), recurse=True):
            return None  # it holds a tensor of that dtype: the dtype is the checkpoint's or the set-up's
        return {"kind": "returns", "module": call.path, "class": type(module).__name__,
                "source": _source_line(module), "input_dtype": compute, "output_dtype": wanted,
                "how": f"{type(module).__name__}'s own forward computes in {wanted} and returns it from {compute} "
                       f"inputs, holding no {wanted} tensor of its own"}
    return None


def _building_fp32(model: nn.Module, failing: ModuleCall, compute: torch.dtype) -> dict[str, Any] | None:
    """The raising library module's off-dtype parameters, when from_pretrained(dtype=compute) builds them so
    (shape "builds")."""
    module = dict(model.named_modules()).get(failing.path)
    if module is None or not _is_library_class(module):
        return None
    own = _off_dtype(module, compute, recurse=False)
    if not own:
        return None
    inner, prefix = unwrap_model(model)
    short = failing.path[len(prefix) + 1:] if prefix and failing.path.startswith(prefix + ".") else failing.path
    if keep_in_fp32_matcher(inner)(short):
        return None  # declared fp32 on purpose: the class handles it, or another check says so
    built = _skeleton_dtypes(inner, compute)
    names = [f"{short}.{n}" if short else n for n, _ in own]
    if not built or any(built.get(name) != tensor.dtype for name, (_, tensor) in zip(names, own, strict=True)):
        return None  # the set-up changed them: not the class's doing
    dtype = str(own[0][1].dtype).removeprefix("torch.")
    return {"kind": "builds", "module": failing.path, "class": type(module).__name__,
            "source": _source_line(module, "__init__"), "parameters": [n for n, _ in own][:8], "parameter_dtype": dtype,
            "how": f"{type(module).__name__} builds {', '.join(n for n, _ in own[:4])} in {dtype} whatever dtype "
                   f"from_pretrained is given (the model built with dtype={str(compute).removeprefix('torch.')} "
                   "has them so too), and they are not in _keep_in_fp32_modules"}


def _skeleton_dtypes(inner: nn.Module, compute: torch.dtype) -> dict[str, torch.dtype]:
    """Parameter dtypes of the model as from_pretrained(dtype=compute) builds it, on the meta device."""
    config = getattr(inner, "config", None)
    if config is None:
        return {}
    try:
        skeleton, _ = meta_model(config, compute)
    except Exception:  # noqa: BLE001 - no skeleton, no claim about the class
        return {}
    return {n: p.dtype for n, p in skeleton.named_parameters()}


def library_dtype_break(model: nn.Module, tracer: DtypeTracer, compute: torch.dtype) -> dict[str, Any] | None:
    """The library class behind a traced dtype break (module docstring), with its transformers release and source
    line; None when the break is not the class's own doing."""
    import transformers

    failing = tracer.failing_call()
    if failing is None:
        return None
    name = str(compute).removeprefix("torch.")
    found = _returning_fp32(model, tracer, failing, name) or _building_fp32(model, failing, compute)
    if found:
        found["transformers"] = transformers.__version__
    return found


def library_break_fix(found: dict[str, Any], compute: str) -> str:
    """What to do about the class: no change to the checkpoint helps."""
    cast = (f"cast the model once after loading (`model.to(torch.{compute})`: it casts the {found['parameter_dtype']} "
            "parameters the class built), or " if found["kind"] == "builds" else "")
    flag = "fp16" if compute == "float16" else "bf16"
    return (f"This is transformers' {found['class']} ({found['source']}), not your checkpoint: {cast}run every "
            f"forward under autocast (TrainingArguments({flag}=True) in one process per GPU: no DataParallel, whose "
            "replica threads lose autocast), or train in float32 (dtype=torch.float32).")
