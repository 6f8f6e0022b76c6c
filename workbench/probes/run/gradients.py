"""run.gradients: what the logged grad_norm says.

A non-finite grad_norm with a finite loss is a step whose gradient overflowed; under fp16 the GradScaler skips the
optimizer step. The learning rate the Trainer logs at step s is the one step s used (read after the optimizer step,
before the scheduler's: transformers 5.23 trainer.py `_get_learning_rate` then `lr_scheduler.step()` unless
`accelerator.optimizer_step_was_skipped`), so a skip shows at the NEXT logged step: the rate held there when the
scheduler saw the skip, moved on when it did not — accelerate reports no skip for an optimizer that handles AMP
scaling itself (fused AdamW, transformers' default `adamw_torch_fused` with torch >= 2.8; accelerate #4242). A few
skips at the start are the scaler finding its scale. grad_norm 0.0 while the loss is not 0.0 means no trainable
parameter received a gradient (the Trainer's norm skips `grad is None`).
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
        held, advanced = _scheduler_after(steps, lr, log.learning_rate_logged, skipped)
        bad = steps[skipped]
        early = bool(len(bad) <= CALIBRATION_SKIPS and bad[-1] <= max(steps[0], EARLY_SHARE * log.global_step))
        verdict = "info" if early else "warn"
        recorded = {k: facts.configuration.get(k) for k in ("fp16", "optim")
                    if facts.configuration.get(k) is not None}
        findings.append(Finding(
            CHECK, verdict, f"grad_norm inf/nan with a finite loss at {len(bad)} step(s)"
                            + (" (the fp16 scaler's calibration)" if early else ""),
            f"At steps {steps_text(bad)} the gradient overflowed while the loss stayed finite. "
            + _scheduler_text(held, advanced, facts)
            + ("A few skips at the start are the scaler lowering its initial scale." if early else
               f"{len(bad)} overflowed steps ({len(bad) / max(1, log.global_step):.1%} of the run) train less than "
               "asked."),
            {**evidence, "steps": bad[:50].tolist(), "lr_held_after": held[:50], "lr_advanced_after": advanced[:50],
             **recorded},
            "" if early else "Use bf16 instead of fp16 where the hardware has it; else lower the learning rate, "
            "keep max_grad_norm, and look for fp16 overflow in the forward (notebook 04's forward.scenarios)"
            + (". So that the schedule waits for the skipped updates, use an unfused optimizer (optim='adamw_torch') "
               "until accelerate #4242 is fixed" if advanced and _fused_or_unknown(facts) else "") + "."))
        marks.append(Mark("grad_norm", tuple(bad.tolist()), "overflow (step skipped)"))
    zero = logged & (grad == 0.0) & supervised
    explained = _explained_by_the_runs_signal(log, facts) if zero.any() else None
    if explained is not None:
        bad = steps[zero]
        findings.append(Finding(
            CHECK, "warn", f"grad_norm 0.0 with a non-zero loss at {len(bad)} step(s): {explained[0]}",
            f"At steps {steps_text(bad)} the gradient norm is exactly 0.0 while the {facts.kind.name} loss is not: "
            f"{explained[1]}", {**evidence, "steps": bad[:50].tolist(), "explained_by": explained[0]},
            f"See {explained[0]}: its fix comes first."))
        marks.append(Mark("grad_norm", tuple(bad.tolist()), "no gradient"))
    elif zero.any():
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
                        "Every logged loss is 0.0 or non-finite: "
                        + ("run.loss says why." if facts.kind.is_sft else
                           f"a {facts.kind.name} loss of 0.0 is read by the run's own signals (run_signals: "
                           "run.reward_variance, run.preference_signal)."), evidence)], marks
    if not findings:
        aside = int((logged & ~supervised).sum())
        findings.append(Finding(CHECK, "pass", f"grad_norm finite and non-zero at the {int(judged.sum())} logged "
                                f"steps with a non-zero loss (median {float(np.median(grad[finite])):.4g})"
                                + (f"; {aside} with loss 0.0 {_zero_loss_reader(facts)}" if aside else ""), "",
                                evidence))
    return findings, marks


def _explained_by_the_runs_signal(log: TrainingLog, facts: RunFacts) -> tuple[str, str] | None:
    """(check, why) when a preference or RL run's own signal says every gradient is zero: beta 0 (every implicit
    reward 0), pairs the policy cannot tell apart (margins 0, equal log-probabilities), or no reward variance in any
    group. Margins 0 over pairs that differ is a gradient that does not land: the model-level causes below."""
    if facts.kind.is_sft:
        return None
    from workbench.probes.run.online_rl_signals import no_reward_variance
    from workbench.probes.run.preference_signals import no_signal, pairs_alike

    if facts.kind.arg("beta") == 0 and facts.kind.family == "preference":
        return ("run.preference_signal", f"with {facts.kind.cite('beta')} every implicit reward is 0 and so is the "
                                         "gradient of its loss (trl #1627).")
    if no_signal(log) and pairs_alike(log) and "kto" not in facts.kind.trainers:
        return ("run.preference_signal", "chosen and rejected are the same tokens at every step (margins 0, equal "
                                         "log-probabilities): nothing separates them, so nothing moves the policy.")
    if no_reward_variance(log, facts.kind):
        return ("run.reward_variance", "every group's completions got the same reward: every advantage is 0, and the "
                                       "policy gradient with it.")
    return None


def _zero_loss_reader(facts: RunFacts) -> str:
    """Who reads the steps whose loss is 0.0: run.loss for a supervised run; a GRPO/RLOO loss is 0 by construction
    when the update is on-policy (trl #3452), read through the run's own signals."""
    if facts.kind.is_sft:
        return "are run.loss's"
    return f"left to the {facts.kind.name} run's own signals (run_signals)"


def _scheduler_after(steps, lr, lr_logged, skipped) -> tuple[list[int], list[int]]:
    """The overflowed steps after which the logged learning rate held, and those after which it moved on; judged
    only where the next step is logged and the schedule moves elsewhere (a constant rate tells nothing)."""
    known = lr_logged & np.isfinite(lr)
    pair = np.zeros(len(steps), dtype=bool)  # entry i and i + 1 are consecutive steps, both with a rate
    pair[:-1] = (steps[1:] == steps[:-1] + 1) & known[1:] & known[:-1]
    same = np.zeros(len(steps), dtype=bool)
    same[:-1] = lr[1:] == lr[:-1]
    if not (pair & ~same & ~skipped).any():  # the schedule never moves between two clean steps
        return [], []
    held = steps[skipped & pair & same].tolist()
    advanced = steps[skipped & pair & ~same].tolist()
    return [int(s) for s in held], [int(s) for s in advanced]


def _fused_or_unknown(facts: RunFacts) -> bool:
    optim = facts.configuration.get("optim")
    return optim is None or "fused" in str(optim)


def _scheduler_text(held: list[int], advanced: list[int], facts: RunFacts) -> str:
    config = facts.configuration
    text = ""
    if held:
        text += (f"After {len(held)} of them ({steps_text(held)}) the learning rate held at the next step: the "
                 "GradScaler skipped the optimizer step and the scheduler waited with it. ")
    if not advanced:
        return text
    text += (f"After {len(advanced)} of them ({steps_text(advanced)}) the learning rate moved on although "
             + (f"the step was skipped ({config.cite('fp16')})" if config.get("fp16") else
                "the gradient was not finite") + ": ")
    if _fused_or_unknown(facts):
        text += ("under fp16 the GradScaler skipped the update but the scheduler advanced, because accelerate "
                 "reports no skip for an optimizer that handles AMP scaling itself (fused AdamW: "
                 + (config.cite("optim") if config.get("optim") else
                    "optim 'adamw_torch_fused', transformers' default with torch >= 2.8")
                 + "; accelerate #4242), so the schedule runs ahead of the updates")
    else:
        text += (f"the scheduler stepped although {config.cite('optim')} is not fused: no skip was reported (an "
                 "optimizer passed to the Trainer that handles scaling itself, or no GradScaler at all)")
    if not config.get("fp16"):
        text += "; without fp16 there is no scaler and the optimizer applied these steps"
    return text + ". "
