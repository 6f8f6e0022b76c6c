"""train.reference_model: the reference a trl trainer compares the policy with (DPO, KTO, GRPO and RLOO's KL, …),
as the trainer holds it before the first step.

trl 1.16 keeps no separate reference for a PEFT policy (the adapters disabled are the reference), nor when
`precompute_ref_log_probs` is set, nor for a GRPO run with `beta` 0 (dpo_trainer.py:908-914, grpo_trainer.py:984-
990); otherwise it builds one from the policy's path with the policy's dtype (dpo_trainer.py:922-927), or takes the
`ref_model` you pass. A reference you pass can differ from the policy: another dtype (its log-probabilities in
another precision, and its memory: twice the policy's in fp32 beside bf16), another device, or another model
altogether (its config's model type or size). Each is a `warn` naming both sides; the memory is measured from the
parameters. A reference whose parameters require grad is normal: trl builds its own that way and runs it under
`torch.no_grad()`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from workbench.display.nodes import Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.errors import NotApplicable
from workbench.findings import Finding, combine_findings

CHECK = "train.reference_model"


def _profile(model) -> dict[str, Any]:
    """The dominant floating dtype and device of a model's parameters, its trainable count and bytes."""
    dtypes, devices = Counter(), Counter()
    trainable = total_bytes = 0
    for p in model.parameters():
        if p.is_floating_point():
            dtypes[str(p.dtype).removeprefix("torch.")] += p.numel()
        devices[str(p.device)] += p.numel()
        trainable += p.numel() if p.requires_grad else 0
        total_bytes += p.numel() * p.element_size()
    config = getattr(model, "config", None)
    return {"dtype": dtypes.most_common(1)[0][0] if dtypes else None,
            "device": devices.most_common(1)[0][0] if devices else None, "trainable": trainable,
            "bytes": total_bytes, "model_type": getattr(config, "model_type", None),
            "hidden_size": getattr(config, "hidden_size", None),
            "layers": getattr(config, "num_hidden_layers", None)}


@dataclasses.dataclass(repr=False)
class ReferenceResult(ProbeResult):
    trainer: str
    why_none: str | None  # no separate reference: why (trl's rule for this configuration)
    policy: dict[str, Any] | None
    reference: dict[str, Any] | None

    def findings(self) -> list[Finding]:
        evidence = {"trainer": self.trainer, "policy": self.policy, "reference": self.reference}
        if self.reference is None:
            return [Finding(CHECK, "info", f"No separate reference model: {self.why_none}",
                            "trl keeps none for this configuration; nothing to compare.", evidence)]
        p, r = self.policy, self.reference
        found = []
        if r["dtype"] != p["dtype"]:
            found.append(Finding(
                CHECK, "warn", f"The reference model is {r['dtype']}, the policy {p['dtype']}",
                f"The {self.trainer} compares the policy's log-probabilities with a reference in another precision "
                f"(its implicit rewards and KL carry the rounding difference from the first step), and holds "
                f"{r['bytes'] / 2**20:.1f} MiB for it against the policy's {p['bytes'] / 2**20:.1f} MiB.", evidence,
                f"Load the reference with `dtype=torch.{p['dtype']}` (the policy's), or pass no `ref_model`: trl then "
                "builds it from the policy's path in the policy's dtype."))
        if r["device"] != p["device"]:
            found.append(Finding(
                CHECK, "warn", f"The reference model is on {r['device']}, the policy on {p['device']}",
                "Every reference forward moves the batch between devices (or fails under a device map).", evidence,
                "Let the trainer place it (pass the reference without a device_map, or no `ref_model`)."))
        shape = ("model_type", "hidden_size", "layers")
        if any(r[k] != p[k] for k in shape if r[k] is not None and p[k] is not None):
            found.append(Finding(
                CHECK, "warn", f"The reference is another model: {r['model_type']} {r['hidden_size']}×{r['layers']} "
                               f"against the policy's {p['model_type']} {p['hidden_size']}×{p['layers']}",
                "The implicit rewards and the KL compare two different networks: at step 0 they are not 0.", evidence,
                "Pass the policy's own starting checkpoint as `ref_model` (or none: trl builds it from the policy)."))
        if found:
            return [combine_findings(found)]
        return [Finding(CHECK, "pass", f"The reference matches the policy: {r['dtype']} on {r['device']}, the same "
                                       f"{r['model_type']}", "", evidence)]

    def view(self):
        if self.reference is None:
            return Display(Paragraph(f"{self.trainer}: no separate reference model ({self.why_none})."))
        keys = ("dtype", "device", "trainable", "bytes", "model_type", "hidden_size", "layers")
        return Display(Table(["", "policy", "reference"],
                             [[k, str(self.policy[k]), str(self.reference[k])] for k in keys], left=True))


def reference_model_probe(configuration) -> ReferenceResult:
    trainer = getattr(configuration, "trainer", None)
    if trainer is None or not hasattr(trainer, "ref_model"):
        raise NotApplicable("the configuration holds no trl trainer with a reference model (DPO, KTO, GRPO, RLOO, "
                            "…)", "no reference-model trainer")
    name = type(trainer).__name__
    policy = trainer.model
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    reference = trainer.ref_model
    if reference is None:
        args = trainer.args
        why = ("the policy is a PEFT model: its adapters disabled are the reference" if hasattr(policy, "peft_config")
               else "precompute_ref_log_probs=True: the reference's log-probabilities are computed once, up front"
               if getattr(args, "precompute_ref_log_probs", False)
               else f"beta={getattr(args, 'beta', None)!r}: no KL term, no reference"
               if getattr(args, "beta", None) == 0 else "the trainer holds none")
        return ReferenceResult(name, why, _profile(base), None)
    unwrapped = getattr(reference, "module", reference)  # a DDP/accelerate wrapper's module
    return ReferenceResult(name, None, _profile(base), _profile(unwrapped))
