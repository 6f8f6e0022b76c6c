"""run.loss: what the logged training loss says.

With `logging_nan_inf_filter=True` (the default) a NaN or inf loss is not logged: the Trainer adds the mean of the
window's earlier losses instead (trainer.py, `_inner_training_loop`), which is 0.0 once the weights are NaN, so the
log shows `loss: 0.0` beside `grad_norm: nan` (reproduced with transformers 5.23 on CPU). A batch whose labels are all
-100 logs `loss: 0.0, grad_norm: 0.0`. Gradient accumulation that multiplies the loss shows as a first loss that is
k times the expected initial loss ln(classes) of a fresh head (transformers #34263, #47688).
"""

from __future__ import annotations

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.trainer_state import Mark, TrainingLog, steps_text

CHECK = "run.loss"
INFLATION_RATIO = 1.8  # a first loss this many times ln(classes) or more is not a fresh head's
FLAT_POINTS = 10  # fewer logged losses than this: too short to call flat
FLAT_CHANGE = 0.02  # the last fifth's median within 2 % of the first fifth's: flat


def judge_loss(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    if not log.entries:
        return [Finding(CHECK, "skip", "No training loss logged",
                        f"{facts.name(facts.state_path)} has no log entry with a loss (logging_steps "
                        f"{log.state.get('logging_steps')}, global_step {log.global_step})", {},
                        "Log more often (logging_steps) to let the run be judged")], []
    findings: list[Finding] = []
    marks: list[Mark] = []
    loss, grad, steps = log.loss, log.grad_norm, log.step
    evidence_base = {"trainer_state": str(facts.state_path), "logged_steps": int(log.entries)}
    hidden = (loss == 0.0) & log.grad_norm_logged & ~np.isfinite(grad)
    if hidden.any():
        findings.append(_hidden_nan(log, facts, steps[hidden], evidence_base))
        marks.append(Mark("loss", tuple(steps[hidden].tolist()), "NaN logged as 0.0"))
    logged_nan = ~np.isfinite(loss)
    if logged_nan.any():
        bad = steps[logged_nan]
        findings.append(Finding(CHECK, "fail", f"Loss logged as NaN/inf from step {bad[0]}",
                                f"The loss is non-finite at steps {steps_text(bad)} (logging_nan_inf_filter off).",
                                {**evidence_base, "steps": bad[:50].tolist()},
                                _nan_fix(facts, int(bad[0]))))
        marks.append(Mark("loss", tuple(bad.tolist()), "NaN loss"))
    if not facts.kind.is_sft:  # a preference or RL loss is no cross-entropy over labels: only NaN is judged here
        return _trl_loss(log, facts, findings, marks, evidence_base)
    masked = (loss == 0.0) & (grad == 0.0)
    if masked.any():
        bad = steps[masked]
        every = bool(masked.all())
        findings.append(Finding(
            CHECK, "fail" if every or masked.mean() >= 0.01 else "warn",
            ("Every logged step has loss 0.0 and grad_norm 0.0: no label is supervised" if every else
             f"Loss 0.0 with grad_norm 0.0 at {int(masked.sum())} logged step(s)"),
            f"At steps {steps_text(bad)} the loss is exactly 0.0 and the gradient norm exactly 0.0: every label of "
            "those batches is -100 (the loss has nothing to average; nothing is learned from them).",
            {**evidence_base, "steps": bad[:50].tolist(), "share": round(float(masked.mean()), 4)},
            "Check the collator's labels on a batch of the run's data (notebook 07: `diagnose CKPT --data "
            "YOUR.jsonl`): a completion-only / assistant-only mask that finds no answer (a response template that "
            "never matches after tokenization), answers cut away by max_length, or pad = EOS masking every token."))
        marks.append(Mark("loss", tuple(bad.tolist()), "all labels -100"))
    finite = np.isfinite(loss) & (loss != 0.0)
    inflated = _inflated_first_loss(log, facts, finite, evidence_base)
    if inflated is not None:
        findings.append(inflated)
        marks.append(Mark("loss", (int(steps[finite][0]),), "first loss ×k"))
    flat = _flat(log, finite, evidence_base)
    if flat is not None:
        findings.append(flat)
    if not findings:
        good = loss[finite]
        findings.append(Finding(CHECK, "pass", f"Loss finite and supervised at every logged step: {good[0]:.4g} at "
                                f"step {steps[finite][0]} → {good[-1]:.4g} at step {steps[finite][-1]}",
                                f"{log.entries} logged steps read from {facts.name(facts.state_path)}.",
                                {**evidence_base, "first": float(good[0]), "last": float(good[-1])}))
    return findings, marks


def _trl_loss(log: TrainingLog, facts: RunFacts, findings: list[Finding], marks: list[Mark],
              evidence: dict) -> tuple[list[Finding], list[Mark]]:
    """A trl preference or RL run's loss: NaN judged like any loss; labels, ln(classes) and flatness are SFT readings
    (a DPO loss starts at ln 2, a GRPO loss sits near 0 by construction: trl #3452), left to run_signals' checks."""
    if findings:
        return findings, marks
    finite = log.loss[np.isfinite(log.loss)]
    kind = facts.kind
    return [Finding(CHECK, "pass", f"Loss finite at every logged step of this {kind.name} run: {finite[0]:.4g} → "
                                   f"{finite[-1]:.4g}",
                    f"{log.entries} logged steps read from {facts.name(facts.state_path)}; {kind.evidence}. A "
                    f"{kind.name} loss is not a cross-entropy over labels: the supervised-loss readings (all labels "
                    "masked, the first loss against ln(classes), a flat loss) do not apply; the run's own signals are "
                    "read by run.preference_signal, run.reward_variance and the other run_signals checks.",
                    {**evidence, "first": float(finite[0]), "last": float(finite[-1]), "trainer": kind.name})], marks


def _hidden_nan(log: TrainingLog, facts: RunFacts, bad: np.ndarray, evidence: dict) -> Finding:
    first = int(bad[0])
    windows = log.loss[np.isfinite(log.loss) & (log.loss != 0.0)]
    detail = (f"At steps {steps_text(bad)} the loss is logged as 0.0 with grad_norm nan/inf: the loss was NaN and "
              "logging_nan_inf_filter (on by default) logged the mean of the window's earlier losses instead — 0.0 "
              "once the weights are NaN.")
    extra: dict = {"steps": bad[:50].tolist(), "first_step": first}
    if log.train_loss is not None and len(windows):
        detail += (f" The final train_loss {log.train_loss:.4g} averages those 0.0 windows in (the finite windows' "
                   f"mean is {windows.mean():.4g}).")
        extra["train_loss"], extra["finite_windows_mean"] = log.train_loss, float(windows.mean())
    after = facts.checkpoint_at_or_after(first)
    if after is not None:
        non_finite = non_finite_tensors(after[1])
        if non_finite is not None:
            extra["checkpoint_checked"] = facts.name(after[1])
            extra["non_finite_tensors"] = non_finite[:20]
            name = facts.name(after[1])
            detail += (f" {name} holds {len(non_finite)} tensor(s) with NaN/inf ({', '.join(non_finite[:3])}"
                       f"{' …' if len(non_finite) > 3 else ''})." if non_finite else f" {name}'s weights are finite.")
    return Finding(CHECK, "fail", f"NaN loss hidden as 0.0 from step {first} ({len(bad)} logged steps)", detail,
                   {**evidence, **extra}, _nan_fix(facts, first))


def _nan_fix(facts: RunFacts, first: int) -> str:
    before = facts.checkpoint_before(first)
    resume = (f"resume from {facts.name(before[1])} (the last checkpoint before step {first}) " if before else
              "restart (no checkpoint precedes it) ")
    return (f"The weights after step {first} are not usable: {resume}with `logging_nan_inf_filter=False` to see the "
            "raw loss, a lower learning_rate or max_grad_norm, and bf16 instead of fp16; find the batch of step "
            f"{first} (an empty or all-masked batch, an inf in the inputs).")


def _inflated_first_loss(log: TrainingLog, facts: RunFacts, finite: np.ndarray, evidence: dict) -> Finding | None:
    head = facts.head
    if head is None or not finite.any():
        return None
    first = float(log.loss[finite][0])
    step = int(log.step[finite][0])
    ratio = first / head.expected_initial_loss
    k = round(ratio)
    if ratio < INFLATION_RATIO or abs(ratio - k) > 0.15 * k:
        return None
    ga = facts.configuration.get("gradient_accumulation_steps")
    verdict = "fail" if ga == k else "warn"  # accumulation not recorded (or not k): the signature alone
    known = facts.configuration.cite("gradient_accumulation_steps")
    return Finding(
        CHECK, verdict, f"First loss {first:.4g} is {ratio:.2f}× ln({head.classes}) = "
                        f"{head.expected_initial_loss:.4g}: the gradient-accumulation inflation signature",
        f"A fresh {head.kind} head starts near ln(classes) = {head.expected_initial_loss:.4g} ({head.source}); the "
        f"first logged loss (step {step}) is {ratio:.2f}× that, as when each micro-batch's loss is summed over "
        f"gradient_accumulation_steps = {k} instead of averaged (transformers #34263 and #35663 for causal LMs, "
        f"the latter in 4.48.0; #47688 for sequence/token classification in 5.x; `run.versions` checks the release). {known}.",
        {**evidence, "first_loss": first, "step": step, "expected_initial_loss": head.expected_initial_loss,
         "ratio": round(ratio, 3), "classes": head.classes, "gradient_accumulation_steps": ga},
        f"Train with gradient_accumulation_steps=1 and per_device_train_batch_size × {k} (same effective batch), "
        f"or divide the loss by {k} in a compute_loss override, until the release you use fixes "
        f"{'#47688' if head.kind != 'language model' else '#35663'}; the logged loss and the gradients are ×{k}.")


def _flat(log: TrainingLog, finite: np.ndarray, evidence: dict) -> Finding | None:
    values = log.loss[finite]
    if len(values) < FLAT_POINTS:
        return None
    fifth = max(2, len(values) // 5)
    start, end = float(np.median(values[:fifth])), float(np.median(values[-fifth:]))
    if start <= 0 or (start - end) / start >= FLAT_CHANGE:
        return None
    steps = log.step[finite]
    return Finding(CHECK, "warn", f"Loss flat: median {start:.4g} over steps {steps[0]}–{steps[fifth - 1]}, "
                                  f"{end:.4g} over steps {steps[-fifth]}–{steps[-1]}",
                   f"The last fifth of the logged losses is not {FLAT_CHANGE:.0%} below the first fifth: the run "
                   "does not learn.",
                   {**evidence, "first_fifth_median": start, "last_fifth_median": end},
                   "Look at run.schedule (a learning rate stuck at 0 or in warmup) and run.gradients (no gradient "
                   "reaching the trainable parameters), then at the labels (notebook 07).")


def non_finite_tensors(folder, max_bytes: int = 256 * 2**20) -> list[str] | None:
    """Names of the tensors holding NaN/inf in a checkpoint's safetensors (model or adapter); None when there is no
    such file or it is bigger than `max_bytes` (not cheap enough to read)."""
    from pathlib import Path

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files or sum(f.stat().st_size for f in files) > max_bytes:
        return None
    from safetensors import safe_open

    from workbench.model.finiteness import all_finite

    bad = []
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not all_finite(tensor):
                    bad.append(name)
    return bad
