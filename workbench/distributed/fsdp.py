"""`distributed.fsdp`: one FSDP2 step under `MixedPrecisionPolicy`, rank by rank, and the verdict on all ranks.

Rank side (run by `workbench.distributed.rank` under torchrun, on a fresh copy of the model): `fsdp_section`
applies `fully_shard` to the decoder blocks and the root with `MixedPrecisionPolicy(param_dtype=<compute dtype>)`
and runs one step under the dtype tracer. Parent side (`workbench.distributed.probes`): `fsdp_finding` names a
buffer the policy leaves in fp32 that promotes activations, or what else broke the step.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

from workbench.distributed.step import rank_inputs, short_error, train_step
from workbench.findings import Finding

if TYPE_CHECKING:
    from workbench.distributed.probes import DistributedResult


# ----- rank side: the step -----

def off_dtype_buffers(model, compute) -> list[dict[str, Any]]:
    """Floating buffers in another dtype than the compute dtype; FSDP's policy casts parameters, never these."""
    from workbench.probes.dtype.islands import is_rotary_buffer

    found = []
    for mod_name, module in model.named_modules():
        frozen = not any(p.requires_grad for p in module.parameters())
        for short, buf in module.named_buffers(recurse=False):
            if buf.dtype.is_floating_point and buf.dtype != compute:
                found.append({"module": mod_name, "buffer": short, "name": f"{mod_name}.{short}",
                              "dtype": str(buf.dtype).removeprefix("torch."), "module_frozen": frozen,
                              "rotary": is_rotary_buffer(module, short)})
    found.sort(key=lambda b: (b["rotary"], not b["module_frozen"], b["name"]))
    return found


def keep_fp32_parameters(model, compute) -> list[dict[str, str]]:
    """Parameters transformers keeps in fp32 on purpose (`_keep_in_fp32_modules`); the policy casts them too."""
    from workbench.probes.dtype.census import keep_in_fp32_matcher
    from workbench.model.components import unwrap_model

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
    from workbench.probes.dtype.islands import compute_dtype_of
    from workbench.probes.dtype.tracer import DtypeTracer

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


# ----- parent side: the finding -----

def fsdp_finding(report: DistributedResult) -> Finding:
    per_rank = [report.section("fsdp", r) or {} for r in range(report.ranks)]
    sec = next((s for s in per_rank if s.get("shard_error") or s.get("error") or s.get("promoting")), per_rank[0])
    evidence = {k: sec.get(k) for k in ("compute_dtype", "policy", "quantized", "units", "shard_error", "error",
                                        "diagnosis", "promoting", "keep_fp32", "inputs", "loss")}
    evidence.update(buffers=sec.get("buffers", [])[:40], traceback=sec.get("traceback"),
                    per_rank={r: s.get("shard_error") or s.get("error") or "ok" for r, s in enumerate(per_rank)},
                    versions=(report.results.get(0) or {}).get("versions"), launch=report.launch_summary())
    compute = sec.get("compute_dtype")
    if sec.get("shard_error"):
        if sec.get("quantized"):
            return Finding("distributed.fsdp", "skip", "fully_shard refuses this quantized model",
                           sec["shard_error"], evidence, "FSDP with bitsandbytes needs bnb_4bit_quant_storage set to "
                           "the compute dtype (FSDP-QLoRA); or train with DDP.")
        return Finding("distributed.fsdp", "warn", f"fully_shard raises on this model: {sec['shard_error'][:200]}",
                       f"Applied to {len(sec['units'])} block(s) from _no_split_modules, then the root.", evidence,
                       "Read the traceback in the evidence.")
    promoting, diagnosis = sec.get("promoting") or [], sec.get("diagnosis")
    if promoting or (sec.get("error") and diagnosis):
        return _fsdp_leak_finding(sec, promoting, diagnosis, evidence)
    if sec.get("error"):
        return Finding("distributed.fsdp", "warn", "The FSDP2 step fails, not on a dtype mismatch",
                       f"{sec['error']} (the dtype tracer saw no mismatch; this may be particular to this machine's "
                       f"{report.backend} backend).", evidence, "Read the traceback in the evidence.")
    quiet = [b for b in sec.get("buffers", []) if not b["rotary"]]
    units = f"{len(sec['units'])} block(s) and the root sharded under {sec['policy']}"
    if sec.get("keep_fp32") or quiet:
        return Finding("distributed.fsdp", "info", f"The FSDP2 step runs ({units}); some tensors stay off {compute}",
                       (f"{len(sec['keep_fp32'])} parameter(s) kept in fp32 on purpose (_keep_in_fp32_modules, e.g. "
                        f"{sec['keep_fp32'][0]['name']}) are cast to {compute} by the policy too. "
                        if sec.get("keep_fp32") else "")
                       + (f"{len(quiet)} buffer(s) stay off {compute} without promoting anything, e.g. "
                          f"{quiet[0]['name']} ({quiet[0]['dtype']})." if quiet else ""), evidence,
                       "Give modules that must compute in fp32 their own fully_shard(module, mp_policy="
                       "MixedPrecisionPolicy(param_dtype=torch.float32)).")
    rotary = sum(b["rotary"] for b in sec.get("buffers", []))
    return Finding("distributed.fsdp", "pass", f"The FSDP2 step runs: {units}",
                   f"loss {sec['loss']:.4f}; no buffer promotes activations"
                   + (f" ({rotary} rotary inv_freq buffer(s) stay fp32 on purpose)" if rotary else "")
                   + (". 4-bit weights keep bitsandbytes' storage dtype: the policy shards them but does not cast them"
                      if sec.get("quantized") else "") + ".", evidence)


def _fsdp_leak_finding(sec: dict, promoting: list[dict], diagnosis: dict | None, evidence: dict) -> Finding:
    compute = sec["compute_dtype"]
    broke = f"The step fails: {sec['error']}. " if sec.get("error") else ""
    traced = f"Traced: {diagnosis['summary']}. " if diagnosis else ""
    if promoting:
        first = promoting[0]
        frozen = "frozen " if first["module_frozen"] else ""
        return Finding("distributed.fsdp", "fail",
                       f"Under FSDP2 {sec['policy']}, buffer {first['name']} ({first['dtype']}) of {frozen}module "
                       f"{first['module'] or '(root)'} promotes activations to {first['out']}",
                       broke + traced + f"The policy casts parameters to {compute} but never buffers: "
                       f"`{first['module']}` takes {first['in']} in and gives {first['out']} out.", evidence,
                       f"Cast the buffer before fully_shard: model.get_submodule('{first['module']}')."
                       f"{first['buffer']}.data = ….to(torch.{compute}) (or .to(torch.{compute}) the frozen module); "
                       f"or give that module its own fully_shard(..., mp_policy=MixedPrecisionPolicy("
                       f"param_dtype=torch.{compute}, output_dtype=torch.{compute})).")
    return Finding("distributed.fsdp", "fail", f"Under FSDP2 {sec['policy']}, `{diagnosis['module']}` receives "
                   f"{diagnosis['input_dtype']} (its weight is {diagnosis['module_weight']})",
                   broke + traced, evidence,
                   f"Make `{diagnosis.get('producer') or diagnosis['module']}` output {compute}: cast its buffers or "
                   f"weights to {compute} before fully_shard, or give it its own fully_shard with "
                   f"MixedPrecisionPolicy(output_dtype=torch.{compute}).")
