"""`distributed.fsdp`, rank side (run by `workbench.distributed.rank` under torchrun, on a fresh copy of the model):
one FSDP2 step under `MixedPrecisionPolicy`.

`fsdp_section` applies `fully_shard` to the decoder blocks and the root with
`MixedPrecisionPolicy(param_dtype=<compute dtype>)` and runs one step under the dtype tracer. The verdict on all
ranks is `fsdp_verdict.fsdp_finding`, in the parent.
"""

from __future__ import annotations

import traceback
from typing import Any

from workbench.distributed.train_step import rank_inputs, short_error, train_step

# ----- rank side: the step -----

def off_dtype_buffers(model, compute) -> list[dict[str, Any]]:
    """Floating buffers in another dtype than the compute dtype; FSDP's policy casts parameters, never these."""
    from workbench.model.dtypes import dtype_name, off_compute_dtype

    found = [{"module": off.module_name, "buffer": off.short, "name": off.name, "dtype": dtype_name(off.tensor.dtype),
              "module_frozen": off.module_frozen, "rotary": off.rotary}
             for off in off_compute_dtype(model, compute, kinds=("buffer",))]
    found.sort(key=lambda b: (b["rotary"], not b["module_frozen"], b["name"]))
    return found


def keep_fp32_parameters(model, compute) -> list[dict[str, str]]:
    """Parameters transformers keeps in fp32 on purpose (`_keep_in_fp32_modules`); the policy casts them too."""
    from workbench.model.components import unwrap_model
    from workbench.model.dtypes import keep_in_fp32_matcher

    inner, prefix = unwrap_model(model)
    keep = keep_in_fp32_matcher(inner)
    return [{"name": n, "dtype": str(p.dtype).removeprefix("torch.")} for n, p in model.named_parameters()
            if p.dtype.is_floating_point and p.dtype != compute
            and keep(n[len(prefix) + 1:] if prefix and n.startswith(prefix + ".") else n)]


def shard(model, policy) -> list[str]:
    """fully_shard on every block transformers declares unsplittable (`_no_split_modules`, what accelerate's FSDP
    wraps by default), innermost first, then on the root."""
    from torch.distributed.fsdp import fully_shard

    from workbench.model.components import unwrap_model

    inner, _ = unwrap_model(model)
    block_types = set(getattr(inner, "_no_split_modules", None) or ())
    units = [name for name, m in model.named_modules() if name and type(m).__name__ in block_types]
    for name in reversed(units):
        fully_shard(model.get_submodule(name), mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return units


def promoting_buffers(calls, buffers: list[dict[str, Any]], compute: str) -> list[dict[str, Any]]:
    """Modules owning an off-dtype buffer that took the compute dtype in and gave another dtype out."""
    owners = {b["module"]: b for b in buffers if not b["rotary"]}
    seen, out = set(), []
    for call in calls:
        owner = owners.get(call.path)
        if owner and call.outputs and call.outputs[0] != compute and compute in call.inputs and call.path not in seen:
            seen.add(call.path)
            out.append({**owner, "in": ",".join(call.inputs), "out": call.outputs[0]})
    return out


def fsdp_section(model, target, rank: int) -> dict[str, Any]:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from workbench.model.components import unwrap_model
    from workbench.model.dtypes import compute_dtype_of
    from workbench.model.tracer import DtypeTracer

    compute = compute_dtype_of(model)
    name = str(compute).removeprefix("torch.")
    inner, _ = unwrap_model(model)
    inputs, how = rank_inputs(model, target, rank)
    section: dict[str, Any] = {
        "compute_dtype": name, "policy": f"MixedPrecisionPolicy(param_dtype=torch.{name})", "inputs": how,
        "quantized": bool(getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False)),
        "buffers": off_dtype_buffers(model, compute), "keep_fp32": keep_fp32_parameters(model, compute),
        "units": [], "shard_error": None, "error": None, "loss": None, "diagnosis": None, "promoting": [],
        "flow": []}
    try:
        section["units"] = shard(model, MixedPrecisionPolicy(param_dtype=compute))
    except Exception as exc:  # noqa: BLE001 - a model fully_shard refuses is the finding
        section["shard_error"] = short_error(exc)
        section["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
        return section
    model.train()
    with DtypeTracer(model) as tracer:
        try:
            section["loss"] = train_step(model, inputs)  # no autocast: the policy is the mixed precision
        except Exception as exc:  # noqa: BLE001 - the failing step is the finding
            section["error"] = short_error(exc)
            section["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
    section["promoting"] = promoting_buffers(tracer.calls, section["buffers"], name)
    if section["error"]:
        section["diagnosis"] = tracer.diagnosis()
        section["flow"] = tracer.flow()
    del tracer
    torch.distributed.barrier()
    return section
