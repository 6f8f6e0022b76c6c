"""`distributed.fsdp`, parent side: the verdict on all ranks' FSDP2 step (`fsdp.fsdp_section` ran it under
torchrun): a buffer the mixed-precision policy leaves in fp32 that promotes activations, or what else broke the step.
"""

from __future__ import annotations

from workbench.distributed.rank_results import RankResults
from workbench.findings import Finding


def fsdp_finding(report: RankResults) -> Finding:
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
