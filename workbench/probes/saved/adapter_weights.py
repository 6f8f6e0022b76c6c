"""`adapter.weights`: what the adapter file itself holds, read from the file alone.

- empty: no tensors, or tensors of shape [0] — what DeepSpeed ZeRO-3 saves when the parameters were not gathered
  before `save_pretrained` (peft #2500, #453, accelerate #3508, DeepSpeed #4295);
- no-op: every `lora_B` exactly zero. LoRA initialises `lora_A` at random and `lora_B` at zero, so an adapter that
  never trained (or whose gradients never reached it) is exactly that (alpaca-lora #357, unsloth #2142);
- NaN / inf anywhere;
- part of it never moved: a whole component whose every lora_B is zero while the others moved (a VLM trained on
  text-only batches never runs its vision tower), or a quarter of the adapted modules or more. Fewer, inside a
  component that did move, stay a pass named in the text (LLaVA's last CLIP layer, unused under
  vision_feature_layer=-2, gets no gradient by design);
- per adapted module, the norm of the update it adds, ‖B·A‖_F · scaling (scaling = lora_alpha / r, or / √r with
  rsLoRA), as a table and a plot: a component whose modules never moved stands out.

‖B·A‖_F is computed from two r×r matrices (‖BA‖² = Σ (BᵀB)∘(AAᵀ)), so a 7B adapter costs milliseconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.lora import A_PARTS, STILL_SHARE, ModuleUpdate, adapter_module, lora_scaling, update_norm
from workbench.probes.saved.files import SavedFiles

CHECK = "adapter.weights"


@dataclasses.dataclass(repr=False)
class AdapterWeightsResult(ProbeResult):
    adapter: str | None
    file: str | None = None
    file_bytes: int = 0
    skipped: str | None = None  # why the check does not apply
    empty: list[str] = dataclasses.field(default_factory=list)  # why the file is empty
    nonfinite: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    modules: list[ModuleUpdate] = dataclasses.field(default_factory=list)
    other_tensors: list[str] = dataclasses.field(default_factory=list)  # modules_to_save, trainable tokens, ...
    bytes_read: int = 0

    @property
    def never_moved(self) -> list[ModuleUpdate]:
        return [m for m in self.modules if not m.moved]

    def by_component(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for m in self.modules:
            row = out.setdefault(m.component, {"modules": 0, "never_moved": 0, "update_norm_max": 0.0})
            row["modules"] += 1
            row["never_moved"] += 0 if m.moved else 1
            row["update_norm_max"] = max(row["update_norm_max"], m.update_norm)
        return out

    def findings(self) -> list[Finding]:
        evidence = {"adapter": self.adapter, "file": self.file, "file_bytes": self.file_bytes,
                    "bytes_read": self.bytes_read, "per_component": self.by_component(),
                    "modules": len(self.modules), "other_tensors": self.other_tensors[:20]}
        if self.skipped:
            return [Finding(CHECK, "skip", "No adapter file to read", self.skipped, evidence)]
        if self.empty:
            return [Finding(CHECK, "fail", f"The adapter file is empty: {self.empty[0]}", "; ".join(self.empty[:5])
                            + ". Loading it gives the base model back (PEFT fills nothing, or refuses the shapes). "
                            "DeepSpeed ZeRO-3 saves this when the sharded parameters are not gathered before saving "
                            "(peft #2500, #453; accelerate #3508; DeepSpeed #4295).",
                            {**evidence, "empty": self.empty[:20]},
                            "Under ZeRO-3 save through the Trainer/accelerate so the adapter is gathered: "
                            "`trainer.save_model(out)` (or `state_dict = accelerator.get_state_dict(model); "
                            "model.save_pretrained(out, state_dict=state_dict)`), with "
                            "`stage3_gather_16bit_weights_on_model_save: true` in the DeepSpeed config.")]
        if self.nonfinite:
            names = ", ".join(n["tensor"] for n in self.nonfinite[:3])
            return [Finding(CHECK, "fail", f"NaN/inf in {len(self.nonfinite)} adapter tensor(s): {names}",
                            "An adapter holding non-finite values makes every output NaN once applied: training "
                            "diverged (fp16 overflow, a learning rate too high) before this save.",
                            {**evidence, "nonfinite": self.nonfinite[:20]},
                            "Resume from the last checkpoint with finite weights and train in bf16 (`bf16=True`) or "
                            "with a lower learning rate; check `torch.isfinite(p).all()` for every trainable p "
                            "before saving.")]
        if self.modules and not any(m.moved for m in self.modules):
            return [Finding(CHECK, "fail", f"No-op adapter: every lora_B of its {len(self.modules)} modules is "
                            "exactly zero",
                            "LoRA initialises lora_B at zero, so B·A = 0: this adapter changes nothing. It never "
                            "trained, or gradients never reached it (frozen by a wrapper, a learning rate of 0, "
                            "saved before the first step) (alpaca-lora #357, unsloth #2142).", evidence,
                            "Check that the adapter trains before saving: `model.print_trainable_parameters()` "
                            "> 0 and `any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in "
                            "model.named_parameters() if 'lora_B' in n)` after one step (notebook 04's grad.flow).")]
        stood = self.never_moved
        per = self.by_component()
        detail = (f"{len(self.modules)} adapted modules; largest update ‖B·A‖·scaling per component: "
                  + ", ".join(f"{c} {r['update_norm_max']:.3g}" for c, r in per.items()))
        evidence = {**evidence, "never_moved": [m.module for m in stood[:50]],
                    "never_moved_per_component": {c: f"{r['never_moved']} of {r['modules']}" for c, r in per.items()}}
        if stood:
            comps = sorted({m.component for m in stood})
            detail += (f". {len(stood)} module(s) never moved (lora_B zero), in {', '.join(comps)}: "
                       + ", ".join(m.module for m in stood[:5]))
        whole = [c for c, r in per.items() if r["never_moved"] == r["modules"]]  # others moved: not a no-op
        share = len(stood) / len(self.modules) if self.modules else 0.0
        if whole or share >= STILL_SHARE:
            what = (f"the whole {' and '.join(whole)} component{'s' if len(whole) > 1 else ''} never moved"
                    if whole else f"{share:.0%} of the adapted modules never moved")
            counts = ", ".join(f"{c} {r['never_moved']} of {r['modules']}" for c, r in per.items())
            return [Finding(CHECK, "warn", f"Part of the adapter never trained: {what} ({len(stood)} of "
                            f"{len(self.modules)} modules, lora_B exactly zero)",
                            f"{detail}. Never moved per component: {counts}. LoRA initialises lora_B at zero and "
                            "any optimizer step with a gradient moves it, so these modules got no gradient (or no "
                            "step) in the whole run: the adapter changes nothing there.", evidence,
                            self._stood_fix(stood, whole))]
        return [Finding(CHECK, "pass", f"Adapter weights: {len(self.modules)} modules, all finite"
                        + (f"; {len(stood)} never moved" if stood else ", every one moved"), detail, evidence)]

    def _stood_fix(self, stood: list[ModuleUpdate], whole: list[str]) -> str:
        names = ", ".join(m.module for m in stood[:3]) + (f" (and {len(stood) - 3} more)" if len(stood) > 3 else "")
        where = f"the {' and '.join(whole)} component" if whole else "these modules"
        causes = [f"{where} off the forward path of the training batches"
                  + (" (a VLM fine-tuned on text-only batches never runs its vision tower: give the batches images, "
                     "or leave the tower out of target_modules)" if "vision" in whole else ""),
                  "their parameters frozen after the adapter was added (`requires_grad=False`, or an optimizer "
                  "built before get_peft_model)",
                  "a learning rate of 0 for their parameter group, or a save before the first optimizer step"]
        return (f"Find which cause holds for {names}: " + "; ".join(causes) + ". Run notebook 04's grad.flow with a "
                "batch like the training batches: it names the adapted modules that get no gradient. If they are "
                "not meant to train, drop them from target_modules.")

    # -- display --------------------------------------------------------------------------------------------------
    def table(self) -> list[dict[str, Any]]:
        return [{"module": m.module, "component": m.component, "r": m.rank, "scaling": round(m.scaling, 4),
                 "‖A‖": f"{m.norm_a:.3g}", "‖B‖": f"{m.norm_b:.3g}",
                 "‖B·A‖·scaling": f"{m.update_norm:.3g}"}
                for m in self.modules]

    def plot(self):
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 2.6))
        ax = fig.subplots()
        colours = {"vision": "#6a1b9a", "language": "#1565c0", "head": "#c62828", "other": "#757575"}
        for comp in dict.fromkeys(m.component for m in self.modules):
            xs = [i for i, m in enumerate(self.modules) if m.component == comp]
            ax.bar(xs, [self.modules[i].update_norm for i in xs], color=colours.get(comp, "#2e7d32"), label=comp)
        ax.set_xlabel("adapted module (file order)")
        ax.set_ylabel("‖B·A‖ · scaling")
        ax.set_title("Update norm per module: zero bars never moved", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    def details(self):
        from workbench.display.findings_view import figure
        from workbench.display.nodes import Display, Paragraph, Table

        return Display(
            figure(self.plot, "update norm per adapted module") if self.modules else None,
            Table.from_records(self.table()) if self.modules else None,
            Paragraph("Other saved tensors: ", ", ".join(self.other_tensors[:20])) if self.other_tensors else None)


def adapter_weights_probe(files: SavedFiles) -> AdapterWeightsResult:
    """The adapter file's values: empty, no-op, NaN/inf, and the update norm per module."""
    if files.adapter_dir is None or files.adapter is None:
        return AdapterWeightsResult(None, skipped="No adapter: the checkpoint is a full model.")
    result = AdapterWeightsResult(str(files.adapter_dir))
    headers = files.adapter.headers
    if not headers:
        if files.adapter.pickle_files:
            result.skipped = (f"The adapter is saved as pickle ({', '.join(files.adapter.pickle_files)}); the "
                              "workbench does not unpickle. Re-save it with save_pretrained (safetensors is the "
                              "default).")
        else:
            result.empty.append("no adapter_model.safetensors in the adapter folder"
                                + (f" ({'; '.join(files.adapter.problems[:2])})" if files.adapter.problems else ""))
        return result
    result.file = ", ".join(h.path.name for h in headers)
    result.file_bytes = sum(h.file_size for h in headers)
    entries = [t for h in headers for t in h.tensors]
    if not entries:
        result.empty.append(f"{result.file} holds no tensors ({result.file_bytes} bytes)")
    result.empty += [f"{t.name} has shape {list(t.shape)}" for t in entries if t.numel == 0]
    if result.empty:
        return result
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # r x r products: threads only add waiting (100 ms a module on a busy 2-core machine)
    try:
        _read_values(files, headers, result)
    finally:
        torch.set_num_threads(threads)
    return result


def _read_values(files: SavedFiles, headers, result: AdapterWeightsResult) -> None:
    from safetensors import safe_open

    config = files.adapter_config or {}
    pairs: dict[str, dict[str, Any]] = {}
    for header in headers:
        with safe_open(str(header.path), framework="pt") as fh:
            for t in header.tensors:
                value = fh.get_tensor(t.name)
                result.bytes_read += t.nbytes
                if value.is_floating_point():
                    import torch

                    finite = torch.isfinite(value)
                    if not bool(finite.all()):
                        result.nonfinite.append({"tensor": t.name, "nan": int(torch.isnan(value).sum()),
                                                 "inf": int(torch.isinf(value).sum()), "numel": t.numel})
                parsed = adapter_module(t.name)
                if parsed and parsed[1] in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
                    pairs.setdefault(parsed[0], {})["A" if parsed[1] in A_PARTS else "B"] = value
                elif not parsed:
                    result.other_tensors.append(t.name)
    files.count("adapter tensors", result.bytes_read)
    for module, ab in pairs.items():
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            result.other_tensors.append(f"{module} (lora_{'A' if b is None else 'B'} only)")
            continue
        rank = int(a.shape[0])
        scaling = lora_scaling(config, module, rank)
        path = files.map_key(module + ".weight").removesuffix(".weight")
        result.modules.append(ModuleUpdate(module, files.component(path), rank, scaling, float(a.float().norm()),
                                           float(b.float().norm()), update_norm(a, b) * scaling))
