"""Notebook 11's step: `workbench plan` for the diagnosed checkpoint and its `--training-args`, as a finding
(`plan.memory`) with the plan's view, a stacked bar per category and the memory held over the planned steps.

The budget is the one the parameters name (`plan_gpu: h100` or `plan_memory: 80GiB` in `--params`); with none the
plan is information (a verdict on a GPU the user did not name would be a guess).
"""

from __future__ import annotations

import dataclasses

from workbench.display.result import ProbeResult
from workbench.errors import NotApplicable
from workbench.findings import Finding

CHECK = "plan.memory"
GIB = 2**30


@dataclasses.dataclass(repr=False)
class MemoryPlanResult(ProbeResult):
    plan: object  # workbench.plan.planner.Plan

    def findings(self) -> list[Finding]:
        d = self.plan.as_dict()
        s = d["setup"]
        evidence = {k: d[k] for k in ("device", "budget", "peak_bytes", "weights_bytes", "breakdown", "phase",
                                      "fits", "largest_batch", "largest_seq", "toggles", "optimizer")}
        what = (f"{s['setup']} set-up, batch {s['batch']} × seq {s['seq']}, gradient checkpointing "
                f"{'on' if s['gradient_checkpointing'] else 'off'}, {d['optimizer']}")
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in d["breakdown"].items() if v and not k.startswith("unseen"))
        detail = (f"One training step of the model's own code on fake tensors at full size ({what}; no weight "
                  f"read): the peak is reached in {d['phase']}; GiB per category: {parts}. Unseen by fake tensors, "
                  f"as cited lines: {', '.join(t['id'] for t in d['unseen']) or 'none'}.")
        peak = f"{d['peak_bytes'] / GIB:.2f} GiB"
        if d["fits"] is None:
            return [Finding(CHECK, "info", f"Planned peak {peak} for one training step", detail, evidence,
                            "Name the GPU in the parameters (`plan_gpu: h100`, or `plan_memory: 80GiB`) to be told "
                            "whether it fits, the largest batch and sequence and which toggle saves what; or run "
                            "`workbench plan CKPT --training-args FILE --gpu NAME`.")]
        budget = f"{d['budget']['name'] or ''} ({d['budget']['bytes'] / GIB:.2f} GiB)".strip()
        if d["fits"]:
            return [Finding(CHECK, "pass", f"Planned peak {peak} fits {budget}",
                            detail + f" Largest batch at seq {s['seq']}: {d['largest_batch']}; largest sequence at "
                            f"batch {s['batch']}: {d['largest_seq']}.", evidence)]
        fitting = [t for t in d["toggles"] if t["fits"]]
        return [Finding(CHECK, "fail", f"Planned peak {peak} does not fit {budget}", detail, evidence,
                        ("; ".join(f"{t['toggle']} ({t['change']}): {t['peak_bytes'] / GIB:.2f} GiB" for t in fitting)
                         or "No single toggle makes it fit: combine them, or shard over more GPUs (FSDP)")
                        + ".")]

    def details(self):
        from workbench.display.findings_view import figure
        from workbench.display.nodes import Display

        return Display(self.plan.view(), figure(self.draw, "planned memory per category, and held over the steps"))

    def draw(self):
        from matplotlib.figure import Figure

        d, step = self.plan.as_dict(), self.plan.step
        fig = Figure(figsize=(9.5, 3.2))
        bar, line = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 3]})
        bottom = 0.0
        for name, value in d["breakdown"].items():
            if value:
                bar.bar(0, value / GIB, bottom=bottom, label=name.removeprefix("unseen: "))
                bottom += value / GIB
        if d["budget"]["bytes"]:
            bar.axhline(d["budget"]["bytes"] / GIB, color="#c62828", ls="--", lw=1, label=d["budget"]["name"] or "budget")
        bar.set_xticks([])
        bar.set_ylabel("GiB at the peak", fontsize=8)
        bar.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if step.timeline:
            xs, ys = zip(*step.timeline)
            line.plot(xs, [y / GIB for y in ys], lw=1)
            for name, end in step.phase_ends:
                line.axvline(end, color="#9e9e9e", lw=0.6)
                line.text(end, max(ys) / GIB, name.split(" (")[0], rotation=90, fontsize=6, va="top", ha="right")
            layers = f" ({step.timeline_layers}-layer copy)" if step.timeline_layers else ""
            line.set_title(f"held beyond the weights over {len(step.phase_ends) // 3} steps{layers}", fontsize=8)
            line.set_xlabel("allocation event", fontsize=8)
            line.set_ylabel("GiB", fontsize=8)
        line.tick_params(labelsize=7)
        bar.tick_params(labelsize=7)
        fig.tight_layout()
        return fig


def memory_plan_probe(target) -> MemoryPlanResult:
    """The plan of the target's training step under its --training-args (NotApplicable without them)."""
    from workbench.plan.planner import gpu_bytes, make_plan, parse_bytes
    from workbench.plan.setup import NotPlannable, plan_setup

    training_args = getattr(target, "training_args", None)
    if not training_args:
        raise NotApplicable("no --training-args: the plan needs the run's batch, sequence length, checkpointing and "
                            "optimizer (`workbench plan CKPT` plans with flags)", "no --training-args")
    params = getattr(target, "params", None) or {}
    # a model the planner cannot step (speech, a bare encoder) is a skip; a GPU name or size it does not know, or a
    # max_length past the model's positions, is the user's input at fault: its UsageError is the check's error
    name, memory = params.get("plan_gpu"), params.get("plan_memory")
    budget = gpu_bytes(str(name)) if name else parse_bytes(str(memory)) if memory else None
    try:
        setup = plan_setup(str(target.adapter_dir or target.model_dir), training_args=training_args,
                           setup="qlora" if target.setup == "qlora" else "plain",
                           base=str(target.model_dir) if target.adapter_dir else None)
        plan = make_plan(setup, budget_bytes=budget, budget_name=str(name) if name else
                         (str(memory) if memory else None), explore=budget is not None)
    except NotPlannable as exc:
        raise NotApplicable(str(exc), "not a model the planner steps") from None
    return MemoryPlanResult(plan)
