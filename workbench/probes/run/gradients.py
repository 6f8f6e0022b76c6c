"""run.gradients: what the logged grad_norm says.

A non-finite grad_norm with a finite loss and the learning rate unchanged since the previous logged step is a step
the fp16 GradScaler skipped (the optimizer did not step, so neither did the scheduler: Trainer checks
`accelerator.optimizer_step_was_skipped`); a few at the start are the scaler finding its scale. grad_norm 0.0 while
the loss is not 0.0 means no trainable parameter received a gradient (the Trainer's norm skips `grad is None`).
"""

from __future__ import annotations

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.trainer_state import Mark, TrainingLog, steps_text

CHECK = "run.gradients"
SPIKE_FACTOR = 10.0  # a grad_norm this many times the run's median is a spike
CALIBRATION_SKIPS = 5  # GradScaler's first skips while it lowers its initial scale (2**16): expected
EARLY_SHARE = 0.05


def judge_gradients(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    logged = log.grad_norm_logged
    if not logged.any():
        return [Finding(CHECK, "skip", "No grad_norm logged",
                        f"{facts.name(facts.state_path)} logs no grad_norm (an optimizer that reports none, or a "
                        "Trainer release that did not log it).", {"trainer_state": str(facts.state_path)})], []
    loss, grad, steps, lr = log.loss, log.grad_norm, log.step, log.learning_rate
    evidence = {"trainer_state": str(facts.state_path), "logged_steps": int(log.entries)}
    findings: list[Finding] = []
    marks: list[Mark] = []
    supervised = np.isfinite(loss) & (loss != 0.0)  # loss 0.0 rows are run.loss's (hidden NaN, masked labels)
    skipped = logged & ~np.isfinite(grad) & supervised
    if skipped.any():
        same_lr = np.zeros_like(skipped)
        same_lr[1:] = lr[1:] == lr[:-1]
        scaler = skipped & same_lr
        bad = steps[skipped]
        early = bool(len(bad) <= CALIBRATION_SKIPS and bad[-1] <= max(steps[0], EARLY_SHARE * log.global_step))
        verdict = "info" if early else "warn"
        findings.append(Finding(
            CHECK, verdict, f"grad_norm inf/nan with a finite loss at {len(bad)} step(s)"
                            + (" (the fp16 scaler's calibration)" if early else ""),
            f"At steps {steps_text(bad)} the gradient overflowed while the loss stayed finite; at "
            f"{int(scaler.sum())} of them the learning rate did not change since the previous logged step: the "
            "GradScaler skipped the optimizer step, and the scheduler with it. "
            + ("A few skips at the start are the scaler lowering its initial scale." if early else
               f"{len(bad)} skipped steps ({len(bad) / max(1, log.global_step):.1%} of the run) train less than "
               "asked, and the schedule runs late."),
            {**evidence, "steps": bad[:50].tolist(), "lr_unchanged": int(scaler.sum())},
            "" if early else "Use bf16 instead of fp16 where the hardware has it; else lower the learning rate, "
            "keep max_grad_norm, and look for fp16 overflow in the forward (notebook 04's forward.scenarios)."))
        marks.append(Mark("grad_norm", tuple(bad.tolist()), "overflow (step skipped)"))
    zero = logged & (grad == 0.0) & supervised
    if zero.any():
        bad = steps[zero]
        every = bool(zero.sum() == (logged & supervised).sum())
        findings.append(Finding(
            CHECK, "fail" if every else "warn",
            ("grad_norm 0.0 at every step while the loss is not 0.0: nothing trainable gets a gradient" if every
             else f"grad_norm 0.0 with a non-zero loss at {len(bad)} step(s)"),
            f"At steps {steps_text(bad)} the loss is finite and non-zero but the gradient norm over the trainable "
            "parameters is exactly 0.0: none of them is on the loss's graph.",
            {**evidence, "steps": bad[:50].tolist()},
            "Run notebook 04's grad.flow on this checkpoint: it names the trainable tensors that get no gradient and "
            "the cause — typically gradient checkpointing with use_reentrant=True on a frozen embedding without "
            "`model.enable_input_require_grads()` (trl #835), or parameters frozen after the optimizer was built."))
        marks.append(Mark("grad_norm", tuple(bad.tolist()), "no gradient"))
    finite = logged & np.isfinite(grad) & (grad > 0)
    if finite.sum() >= 10:
        median = float(np.median(grad[finite]))
        settled = steps > steps[0] + 0.1 * (steps[-1] - steps[0])  # the first tenth: large early norms are normal
        spikes = finite & settled & (grad > SPIKE_FACTOR * median)
        if spikes.any():
            bad = steps[spikes]
            findings.append(Finding(
                CHECK, "info", f"grad_norm spikes above {SPIKE_FACTOR:g}× the run's median at {len(bad)} step(s)",
                f"At steps {steps_text(bad)} grad_norm exceeds {SPIKE_FACTOR:g}× the median {median:.4g} (max "
                f"{float(grad[spikes].max()):.4g}); max_grad_norm clips what the optimizer applies.",
                {**evidence, "steps": bad[:50].tolist(), "median": median},
                "If the loss jumps at the same steps, look at those batches (very long or unusual rows) and lower "
                "the learning rate."))
            marks.append(Mark("grad_norm", tuple(bad.tolist()), "spike"))
    judged = logged & supervised
    if not judged.any():
        return [Finding(CHECK, "skip", "No step with a non-zero loss to judge the gradients by",
                        "Every logged loss is 0.0 or non-finite: run.loss says why.", evidence)], marks
    if not findings:
        aside = int((logged & ~supervised).sum())
        findings.append(Finding(CHECK, "pass", f"grad_norm finite and non-zero at the {int(judged.sum())} logged "
                                f"steps with a non-zero loss (median {float(np.median(grad[finite])):.4g})"
                                + (f"; {aside} with loss 0.0 are run.loss's" if aside else ""), "", evidence))
    return findings, marks
