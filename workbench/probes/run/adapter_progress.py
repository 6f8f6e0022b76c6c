"""`run.adapter_progress`: the LoRA adapter across a Trainer run's `checkpoint-N/` folders, read from the adapter files
alone (safetensors tensors and adapter_config.json; never the base model).

Per checkpoint and adapted module the update ‖B·A‖_F · scaling (adapter.weights' `update_norm`), then:
- modules that never moved in any checkpoint (lora_B still exactly zero at every save): LoRA initialises lora_B at
  zero, so no optimizer step ever reached them — the signature of reentrant gradient checkpointing without input
  grads (trl #835, unsloth #2142) or of modules off the forward path;
- an adapter that stopped moving: every tensor's norms equal between consecutive checkpoints (no optimizer step
  changed anything between the two saves);
- non-finite values appearing from checkpoint K on.
The plot draws the update norm per component against the step. Components come from `component_of` when the
caller has the base's structure (notebook 00's `SavedFiles.component`); from the adapter alone they are the adapted
layers' names (q_proj, v_proj, ...).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Callable

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.lora import (
    A_PARTS,
    STILL_SHARE,
    ModuleUpdate,
    adapter_module,
    lora_scaling,
    read_json,
    update_norm,
)

CHECK = "run.adapter_progress"
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
ADAPTER_FILE = "adapter_model.safetensors"


@dataclasses.dataclass
class CheckpointAdapter:
    step: int
    folder: str
    modules: list[ModuleUpdate]
    nonfinite: list[str]  # tensor names holding NaN/inf

    def component_norms(self) -> dict[str, float]:
        """‖ΔW‖_F over each component's modules together: √Σ ‖B·A‖²·scaling²."""
        out: dict[str, float] = {}
        for m in self.modules:
            out[m.component] = out.get(m.component, 0.0) + m.update_norm ** 2
        return {c: math.sqrt(v) for c, v in out.items()}

    def signature(self) -> dict[str, tuple[float, float]]:
        return {m.module: (m.norm_a, m.norm_b) for m in self.modules}


def adapter_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint-N/ holding an adapter, sorted by N; the folder itself when it is one
    checkpoint (or a final save) with an adapter."""
    run_dir = Path(run_dir)
    found = sorted(((int(CHECKPOINT.match(p.name).group(1)), p) for p in run_dir.iterdir()
                    if p.is_dir() and CHECKPOINT.match(p.name) and (p / ADAPTER_FILE).is_file()),
                   key=lambda t: t[0]) if run_dir.is_dir() else []
    if not found and (run_dir / ADAPTER_FILE).is_file():
        match = CHECKPOINT.match(run_dir.name)
        state = read_json(run_dir / "trainer_state.json") or {}
        found = [(int(match.group(1)) if match else int(state.get("global_step") or 0), run_dir)]
    return found


def read_checkpoint_adapter(step: int, folder: Path, component_of: Callable[[str], str]) -> CheckpointAdapter:
    from safetensors import safe_open

    from workbench.model.finiteness import all_finite

    config = read_json(folder / "adapter_config.json") or {}
    pairs: dict[str, dict[str, Any]] = {}
    nonfinite = []
    with safe_open(str(folder / ADAPTER_FILE), framework="pt") as fh:
        for name in fh.keys():
            value = fh.get_tensor(name)
            if value.is_floating_point() and not all_finite(value):
                nonfinite.append(name)
            parsed = adapter_module(name)
            if parsed and parsed[1] in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
                pairs.setdefault(parsed[0], {})["A" if parsed[1] in A_PARTS else "B"] = value
    modules = []
    for module, ab in pairs.items():
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            continue
        rank = int(a.shape[0])
        scaling = lora_scaling(config, module, rank)
        modules.append(ModuleUpdate(module, component_of(module), rank, scaling, float(a.float().norm()),
                                    float(b.float().norm()), update_norm(a, b) * scaling))
    return CheckpointAdapter(step, str(folder), modules, nonfinite)


def layer_name(module: str) -> str:
    """The adapted layer's own name (`q_proj` of `model.layers.0.self_attn.q_proj`): a component from the adapter
    alone."""
    return module.rsplit(".", 1)[-1]


@dataclasses.dataclass(repr=False)
class AdapterProgressResult(ProbeResult):
    run_dir: str
    checkpoints: list[CheckpointAdapter]
    components_from: str  # "the base's structure" or "adapted layer names"
    signal_cause: Finding | None = None  # the run's own no-gradient signal (a DPO without margins, a GRPO without
    #                                      reward variance): the cause named instead of the SFT ones

    @property
    def never_moved(self) -> list[ModuleUpdate]:
        """Modules whose lora_B is zero in every checkpoint (named as in the last)."""
        still = set.intersection(*({m.module for m in c.modules if not m.moved} for c in self.checkpoints))
        return [m for m in self.checkpoints[-1].modules if m.module in still]

    @property
    def first_nonfinite(self) -> CheckpointAdapter | None:
        return next((c for c in self.checkpoints if c.nonfinite), None)

    @property
    def unchanged_pairs(self) -> list[tuple[CheckpointAdapter, CheckpointAdapter]]:
        return [(a, b) for a, b in zip(self.checkpoints, self.checkpoints[1:])
                if a.modules and a.signature() == b.signature()]

    def _evidence(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "components_from": self.components_from,
                "checkpoints": [{"step": c.step, "folder": c.folder, "modules": len(c.modules),
                                 "update_norm_per_component": {k: round(v, 6) for k, v in c.component_norms().items()},
                                 "nonfinite": c.nonfinite[:10]} for c in self.checkpoints]}

    def findings(self) -> list[Finding]:
        if not self.checkpoints:
            return [Finding(CHECK, "skip", "No adapter in the run's checkpoints",
                            f"No {ADAPTER_FILE} in {self.run_dir} or its checkpoint-N/ folders: a full fine-tune, or "
                            "no checkpoint saved.", {"run_dir": self.run_dir})]
        evidence = self._evidence()
        steps = ", ".join(f"checkpoint-{c.step}" for c in self.checkpoints)
        bad = self.first_nonfinite
        if bad is not None:
            after = [c for c in self.checkpoints if c.step >= bad.step]
            every_after = all(c.nonfinite for c in after)
            return [Finding(CHECK, "fail", f"NaN/inf in the adapter from checkpoint-{bad.step} on"
                            + ("" if every_after else " (not in every later checkpoint)"),
                            f"Checkpoints {steps}: the adapter is finite up to the one before checkpoint-{bad.step}, "
                            f"which holds non-finite values in {len(bad.nonfinite)} tensor(s): "
                            f"{', '.join(bad.nonfinite[:3])}. Training diverged between the two saves (fp16 overflow, "
                            "a learning rate too high); with logging_nan_inf_filter the logged loss hides it as 0.0.",
                            {**evidence, "first_nonfinite_step": bad.step},
                            self._resume_fix(bad))]
        stood = self.never_moved
        last = self.checkpoints[-1]
        if last.modules and len(stood) == len(last.modules) and self.signal_cause is not None:
            cause = self.signal_cause
            return [Finding(CHECK, "fail", f"The adapter never moved: every lora_B is zero in all "
                            f"{len(self.checkpoints)} checkpoint(s), as {cause.id} explains",
                            f"Checkpoints {steps}: no optimizer step changed the adapter. The run's own signal says "
                            f"why: {cause.title} ({cause.id}) — with no difference to learn, every gradient is zero.",
                            {**evidence, "cause": cause.id}, cause.fix)]
        if last.modules and len(stood) == len(last.modules):
            return [Finding(CHECK, "fail", f"The adapter never moved: every lora_B is zero in all "
                            f"{len(self.checkpoints)} checkpoint(s)",
                            f"Checkpoints {steps}: LoRA initialises lora_B at zero and any optimizer step with a "
                            "gradient moves it, so no step ever reached the adapter. Reentrant gradient checkpointing "
                            "without input grads does this (the checkpointed blocks' outputs do not require grad; "
                            "trl #835, unsloth #2142), as does a learning rate of 0.", evidence,
                            "Train with `gradient_checkpointing_kwargs={\"use_reentrant\": False}` or call "
                            "`model.enable_input_require_grads()` before training; check one step with notebook 04's "
                            "grad.flow.")]
        unchanged = self.unchanged_pairs
        if unchanged:
            a, b = unchanged[0]
            tail = all(pair in unchanged for pair in zip(self.checkpoints[self.checkpoints.index(a):],
                                                          self.checkpoints[self.checkpoints.index(a) + 1:]))
            what = (f"stopped moving after checkpoint-{a.step}" if tail
                    else f"did not move between checkpoint-{a.step} and checkpoint-{b.step}")
            return [Finding(CHECK, "warn", f"The adapter {what}",
                            f"Checkpoints {steps}: every adapter tensor's norms are equal in checkpoint-{a.step} and "
                            f"checkpoint-{b.step}" + (f" (and {len(unchanged) - 1} more consecutive pair(s))"
                                                      if len(unchanged) > 1 else "")
                            + ": no optimizer step changed the adapter between the two saves — a learning rate of 0, "
                            "every step skipped (fp16 GradScaler on inf gradients), or every gradient zero.",
                            {**evidence, "unchanged": [[x.step, y.step] for x, y in unchanged]},
                            "Read the log between those steps (run.schedule for the learning rate, run.gradients for "
                            "skipped or zero-gradient steps) and resume from the last checkpoint that moved.")]
        per: dict[str, list[int]] = {}
        for m in last.modules:
            row = per.setdefault(m.component, [0, 0])
            row[0] += 1
            row[1] += m.module in {s.module for s in stood}
        whole = [c for c, (n, still) in per.items() if still == n]
        first, final = self.checkpoints[0].component_norms(), last.component_norms()
        growth = ", ".join(f"{c} {first.get(c, 0.0):.3g} → {final[c]:.3g}" for c in final)
        detail = (f"Checkpoints {steps}; update norm ‖B·A‖·scaling per component (components from "
                  f"{self.components_from}), first → last: {growth}.")
        evidence["never_moved"] = [m.module for m in stood[:50]]
        if stood and (whole or len(stood) / len(last.modules) >= STILL_SHARE):
            what = (f"the whole {', '.join(whole)} component(s)" if whole
                    else f"{len(stood)} of {len(last.modules)} modules")
            return [Finding(CHECK, "warn", f"Part of the adapter never moved in any checkpoint: {what}",
                            f"{detail} Never moved (lora_B zero in all {len(self.checkpoints)} checkpoint(s)): "
                            + ", ".join(m.module for m in stood[:5]) + ". No optimizer step reached them in the whole "
                            "run: off the training batches' forward path, frozen, or behind reentrant gradient "
                            "checkpointing without input grads (trl #835, unsloth #2142).", evidence,
                            f"Run notebook 04's grad.flow on a training batch: it names the adapted modules that get "
                            f"no gradient ({', '.join(m.module for m in stood[:3])}). Under gradient checkpointing "
                            "pass `gradient_checkpointing_kwargs={\"use_reentrant\": False}`; if they are not meant to "
                            "train, drop them from target_modules.")]
        return [Finding(CHECK, "pass", f"The adapter moved across {len(self.checkpoints)} checkpoint(s)"
                        + (f"; {len(stood)} module(s) never moved" if stood else ""),
                        detail + (f" Never moved: {', '.join(m.module for m in stood[:5])}." if stood else ""),
                        evidence)]

    def _resume_fix(self, bad: CheckpointAdapter) -> str:
        earlier = [c for c in self.checkpoints if c.step < bad.step and not c.nonfinite]
        start = (f"Resume from checkpoint-{earlier[-1].step} (`trainer.train(resume_from_checkpoint="
                 f"\"{earlier[-1].folder}\")`)" if earlier else "Restart the run")
        return (f"{start} with bf16 instead of fp16, or a lower learning rate / `max_grad_norm`; run.loss names the "
                "steps whose loss was logged as 0.0 with a non-finite grad_norm.")

    # -- display --------------------------------------------------------------------------------------------------
    def plot(self):
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 2.8))
        ax = fig.subplots()
        components = list(dict.fromkeys(c for ck in self.checkpoints for c in ck.component_norms()))
        steps = [c.step for c in self.checkpoints]
        for comp in components:
            ax.plot(steps, [c.component_norms().get(comp, float("nan")) for c in self.checkpoints], marker="o",
                    label=comp)
        for c in self.checkpoints:
            if c.nonfinite:
                ax.axvline(c.step, color="#c62828", linestyle="--", linewidth=1)
        ax.set_xlabel("step (checkpoint-N)")
        ax.set_ylabel("‖B·A‖ · scaling")
        ax.set_title("Adapter update norm per component: flat lines stopped moving, zero never moved", fontsize=10)
        if components:
            ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    def details(self):
        from workbench.display.findings_view import figure
        from workbench.display.nodes import Display, Table

        if not self.checkpoints:
            return None
        rows = [{"checkpoint": f"checkpoint-{c.step}", "modules": len(c.modules),
                 "moved": sum(m.moved for m in c.modules), "non-finite tensors": len(c.nonfinite),
                 **{comp: f"{v:.3g}" for comp, v in c.component_norms().items()}} for c in self.checkpoints]
        return Display(figure(self.plot, "adapter update norm per component against the checkpoint step"),
                       Table.from_records(rows))


def adapter_progress_probe(run_dir: Path, component_of: Callable[[str], str] | None = None,
                           signals=None) -> AdapterProgressResult:
    """The adapter in every checkpoint-N/ of a Trainer output_dir (or one checkpoint folder): update norms per
    component, modules that never moved, an adapter that stopped moving, NaN/inf from a checkpoint on."""
    import torch

    found = adapter_checkpoints(Path(run_dir))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # r x r products: threads only add waiting on a busy machine (adapter.weights)
    try:
        checkpoints = [read_checkpoint_adapter(step, folder, component_of or layer_name) for step, folder in found]
    finally:
        torch.set_num_threads(threads)
    return AdapterProgressResult(str(run_dir), checkpoints,
                                 "the base's structure" if component_of else "adapted layer names",
                                 _signal_cause(signals))


def _signal_cause(signals) -> Finding | None:
    """A preference or RL run whose own signal says no gradient could exist (run.preference_signal or
    run.reward_variance `fail`): that finding, the cause of an adapter that never moved."""
    findings = signals.findings() if signals is not None and hasattr(signals, "findings") else []
    return next((f for f in findings if f.verdict == "fail"
                 and f.id in ("run.preference_signal", "run.reward_variance")), None)
