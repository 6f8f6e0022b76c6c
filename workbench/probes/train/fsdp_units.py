"""`train.fsdp_units`: the FSDP units the configuration makes, replayed with torch's own walk (`fsdp_walk`), each
checked against the rule torch enforces when it builds that unit:

- FSDP1 flattens a unit's parameters into one FlatParameter (`torch/distributed/fsdp/_flat_param.py`,
  `FlatParamHandle._validate_tensors_to_flatten`): the first tensor floating ("Cannot flatten integer dtype
  tensors"), one dtype ("Must flatten tensors with uniform dtype but got … and …"), and with
  `use_orig_params=False` one `requires_grad` ("Must flatten tensors with uniform `requires_grad` when
  `use_orig_params=False`"). Checked tensor by tensor in flatten order, as torch does, so the message is the one
  torch would raise first.
- FSDP2 needs one original dtype among a group's trainable parameters
  (`torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`, `FSDPParamGroup._init_mp_dtypes`: "FSDP expects
  uniform original parameter dtype but got {…}", at the first forward).
- QLoRA: `bnb_4bit_quant_storage` must equal the compute dtype for the 4-bit weights to shard with the rest.

`fail` names the unit, its tensors and torch's message; `pass` lists the units; without FSDP in the configuration
the units transformers' default (FSDP2, transformer-based wrap) would make are listed as `info`, except in the
training callback, whose run is known not to shard (neither its arguments nor its accelerator use FSDP): nothing is
replayed then.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from workbench.display.nodes import Display, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.components import unwrap_model
from workbench.probes.train.fsdp_walk import FsdpPlan, Unit, fsdp1_plan, fsdp2_plan

CHECK = "train.fsdp_units"
FLAT_PARAM_SOURCE = "torch/distributed/fsdp/_flat_param.py FlatParamHandle._validate_tensors_to_flatten"
PARAM_GROUP_SOURCE = "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py FSDPParamGroup._init_mp_dtypes"
DEFAULT_PLUGIN_ARGS = {"fsdp_version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}


def _dtype(d: torch.dtype) -> str:
    return str(d)


def fsdp1_error(unit: Unit, use_orig_params: bool) -> tuple[str, list[str]] | None:
    """torch's first ValueError for this unit's flatten, and the tensors it concerns; None when it flattens."""
    dtype, requires_grad, first = None, None, None
    for name, d, grad in unit.params:
        if dtype is None and not d.is_floating_point:
            return "Cannot flatten integer dtype tensors", [f"{name} ({_dtype(d)})"]
        if dtype is not None and d != dtype:
            return (f"Must flatten tensors with uniform dtype but got {dtype} and {d}",
                    [f"{first} ({_dtype(dtype)})", f"{name} ({_dtype(d)})"])
        if not use_orig_params and requires_grad is not None and grad != requires_grad:
            return ("Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`",
                    [f"{first} (requires_grad={requires_grad})", f"{name} (requires_grad={grad})"])
        dtype, requires_grad, first = d, (requires_grad or grad), first or name
    return None


def fsdp2_error(unit: Unit) -> tuple[str, list[str]] | None:
    trainable = [(n, d) for n, d, grad in unit.params if grad]
    dtypes = {d for _, d in trainable}
    if len(dtypes) > 1:
        seen: dict[torch.dtype, str] = {}
        for n, d in trainable:
            seen.setdefault(d, n)
        return (f"FSDP expects uniform original parameter dtype but got {dtypes}",
                [f"{n} ({_dtype(d)})" for d, n in seen.items()])
    return None


@dataclasses.dataclass(repr=False)
class FsdpUnitsResult(ProbeResult):
    configured: bool
    fsdp_cited: str
    plan: FsdpPlan
    problems: list[dict[str, Any]]  # per failing unit: unit, message, tensors, source
    quant_storage: dict[str, str] | None  # QLoRA: storage vs compute dtype when they differ
    seconds: float

    def _units(self) -> list[dict[str, Any]]:
        return [{"unit": u.name or "(root)", "tensors": len(u.params),
                 "dtypes": ", ".join(sorted({_dtype(d).removeprefix("torch.") for _, d, _ in u.params})),
                 "trainable": sum(1 for *_, g in u.params if g)} for u in self.plan.units]

    def findings(self) -> list[Finding]:
        plan = self.plan
        evidence = {"fsdp": self.fsdp_cited, "version": plan.version, "policy": plan.policy,
                    "use_orig_params": plan.use_orig_params, "units": self._units()[:60], "unit_count": len(plan.units),
                    "problems": self.problems[:20], "ignored_4bit": plan.ignored[:20], "upcast_fp32": plan.upcast[:20],
                    "replayed_on": plan.copy_how, "seconds": round(self.seconds, 3), "quant_storage": self.quant_storage}
        if not self.configured:
            problem = (f"; {len(self.problems)} of them would raise ({self.problems[0]['message']})"
                       if self.problems else "")
            return [Finding(CHECK, "info", f"FSDP is not configured; with fsdp=True it would make {len(plan.units)} "
                            "unit(s)" + (", one would raise" if self.problems else ""),
                            f"{self.fsdp_cited}. Under transformers' default (FSDP{plan.version}, {plan.policy}) the "
                            f"units would be {len(plan.units)}{problem}.", evidence)]
        if self.problems:
            first = self.problems[0]
            where = f"FSDP{plan.version} unit {first['unit']}"
            tensors = " vs ".join(first["tensors"])
            return [Finding(CHECK, "fail", f"{where} raises: {first['message']}",
                            f"{self.fsdp_cited}; policy {plan.policy}. Torch builds {len(plan.units)} unit(s); "
                            f"{len(self.problems)} cannot be built. {where}: {tensors} ({first['source']}).",
                            evidence, self._fix(first))]
        if self.quant_storage:
            qs = self.quant_storage
            return [Finding(CHECK, "warn", f"bnb_4bit_quant_storage={qs['storage']} is not the compute dtype "
                            f"{qs['compute']}: the 4-bit weights stay out of FSDP{plan.version}'s shards",
                            f"accelerate's fsdp2_prepare_model leaves non-floating frozen Params4bit unsharded "
                            f"({len(plan.ignored)} here): every rank holds all of them.", evidence,
                            f"BitsAndBytesConfig(..., bnb_4bit_quant_storage=torch.{qs['compute']})")]
        return [Finding(CHECK, "pass", f"{len(plan.units)} FSDP{plan.version} unit(s), each buildable",
                        f"{self.fsdp_cited}; policy {plan.policy}; replayed on the {plan.copy_how} in "
                        f"{self.seconds:.2f} s.", evidence)]

    def _fix(self, problem: dict[str, Any]) -> str:
        message = problem["message"]
        if "requires_grad" in message:
            return ("Set fsdp_config={'use_orig_params': True} (transformers' default), or wrap trainable and frozen "
                    "parameters in separate units (PEFT's fsdp_auto_wrap_policy does for LoRA layers).")
        if self.quant_storage or "integer" in message:
            compute = (self.quant_storage or {}).get("compute", "bfloat16")
            return f"Load with BitsAndBytesConfig(..., bnb_4bit_quant_storage=torch.{compute}) (the compute dtype)."
        dtypes = sorted({t.rsplit("(", 1)[-1].rstrip(")") for t in problem["tensors"]})
        return (f"Give every parameter of the unit one dtype before the Trainer wraps it (e.g. model.to(torch.bfloat16)"
                f" after get_peft_model, or cast the {dtypes[-1]} tensors named here); or use FSDP2 with bf16=True, "
                "where accelerate upcasts trainable parameters to fp32.")

    def details(self):
        return Display(Table.from_records(self._units()[:200]))


def _quant_storage(model) -> dict[str, str] | None:
    inner, _ = unwrap_model(model)
    quantizer = getattr(inner, "hf_quantizer", None)
    config = getattr(quantizer, "quantization_config", None)
    if not getattr(config, "load_in_4bit", False):
        return None
    storage = getattr(config, "bnb_4bit_quant_storage", torch.uint8)
    compute = getattr(config, "bnb_4bit_compute_dtype", None) or torch.float32
    if isinstance(storage, str):
        storage = getattr(torch, storage)
    if storage == compute:
        return None
    return {"storage": str(storage).removeprefix("torch."), "compute": str(compute).removeprefix("torch.")}


def _configuration(config) -> tuple[bool, dict[str, Any], bool, str]:
    args = getattr(config, "args", None)
    plugin_args = getattr(args, "fsdp_plugin_args", None) if args is not None and getattr(args, "fsdp", None) else None
    mixed = bool(args is not None and (getattr(args, "bf16", False) or getattr(args, "fp16", False)))
    if plugin_args:
        cite = config.cite("fsdp_config") if hasattr(config, "cite") else f"fsdp_config={args.fsdp_config!r}"
        return True, dict(plugin_args), mixed, cite
    return False, dict(DEFAULT_PLUGIN_ARGS), mixed, "fsdp is not set in the training configuration"


@dataclasses.dataclass(repr=False)
class FsdpPolicyRefused(ProbeResult):
    """accelerate's own `set_auto_wrap_policy` refuses the policy before any unit exists: a layer class to wrap
    (from `transformer_layer_cls_to_wrap`, else the model's `_no_split_modules`) that the model does not contain."""

    configured: bool
    fsdp_cited: str
    message: str  # accelerate's exception, verbatim
    wrap_classes: list[str]  # what the policy asked for
    present: list[str]  # those the model contains

    def findings(self) -> list[Finding]:
        missing = [c for c in self.wrap_classes if c not in self.present]
        evidence = {"fsdp": self.fsdp_cited, "accelerate": self.message, "wrap_classes": self.wrap_classes,
                    "present": self.present, "missing": missing}
        fix = (f"fsdp_config={{'transformer_layer_cls_to_wrap': {self.present!r}}} (the classes of "
               "_no_split_modules this model contains)" if self.present else
               "Set fsdp_config's transformer_layer_cls_to_wrap to the model's decoder-layer class names.")
        detail = (f"{self.fsdp_cited}. accelerate's FullyShardedDataParallelPlugin.set_auto_wrap_policy looks up every "
                  f"class name of the policy ({', '.join(self.wrap_classes)}) in the model and raises on the first it "
                  f"cannot find: {self.message}")
        if not self.configured:
            return [Finding(CHECK, "info", "FSDP is not configured; with fsdp=True its default policy would raise: "
                            + self.message, detail, evidence, fix)]
        return [Finding(CHECK, "fail", f"accelerate refuses the FSDP wrap policy: {self.message}", detail, evidence,
                        fix)]

    def details(self):
        return Display(Table.from_records([{"class to wrap": c, "in the model": c in self.present}
                                           for c in self.wrap_classes]))


def _policy_refused(model, plugin_args: dict[str, Any], configured: bool, cited: str,
                    exc: ValueError) -> FsdpPolicyRefused:
    inner = unwrap_model(model)
    wrap = plugin_args.get("transformer_layer_cls_to_wrap") or list(getattr(inner, "_no_split_modules", None) or [])
    wrap = [wrap] if isinstance(wrap, str) else list(wrap)
    names = {type(m).__name__ for m in model.modules()}
    return FsdpPolicyRefused(configured, cited, str(exc), wrap, [c for c in wrap if c in names])


@dataclasses.dataclass(repr=False)
class FsdpNotUsed(ProbeResult):
    """The training running now does not shard (neither its arguments nor its accelerator use FSDP)."""

    fsdp_cited: str

    def findings(self) -> list[Finding]:
        return [Finding(CHECK, "info", "FSDP is not used by your Trainer: no unit replayed",
                        f"{self.fsdp_cited}: the run training now does not shard, so the units FSDP would make are "
                        "not replayed.", {"fsdp": self.fsdp_cited},
                        "`workbench diagnose` with `--training-args` naming fsdp replays them.")]


def fsdp_units_probe(prepared, target, config) -> FsdpUnitsResult | FsdpPolicyRefused | FsdpNotUsed:
    model = prepared.model
    configured, plugin_args, mixed, cited = _configuration(config)
    launch = getattr(config, "launch", None)
    if not configured and launch is not None and not launch.fsdp:
        return FsdpNotUsed(f"{cited}; {launch.describe()}")
    start = time.perf_counter()
    version = int(plugin_args.get("fsdp_version", 2))
    try:
        plan = (fsdp1_plan if version == 1 else fsdp2_plan)(model, plugin_args, mixed)
    except ValueError as exc:
        if "Could not find the transformer layer class" not in str(exc):
            raise
        return _policy_refused(model, plugin_args, configured, cited, exc)
    seconds = time.perf_counter() - start
    problems = []
    for unit in plan.units:
        error = fsdp1_error(unit, bool(plan.use_orig_params)) if version == 1 else fsdp2_error(unit)
        if error:
            problems.append({"unit": unit.name or "(root)", "message": error[0], "tensors": error[1],
                             "source": FLAT_PARAM_SOURCE if version == 1 else PARAM_GROUP_SOURCE})
    return FsdpUnitsResult(configured, cited, plan, problems, _quant_storage(model), seconds)
