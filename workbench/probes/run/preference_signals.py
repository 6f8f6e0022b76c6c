"""Preference runs (trl's DPO, KTO, ORPO, CPO/SimPO) read by their own keys: `rewards/margins`,
`rewards/accuracies`, `logps/chosen`, `logps/rejected` (trl 1.16 dpo_trainer.py:1586-1601; the implicit reward of a
completion is β·(log π(y|x) − log π_ref(y|x)), its margin chosen − rejected).

run.preference_signal: margins exactly 0 at every logged step is a run that sees no difference between chosen and
rejected — identical pairs, or pairs that differ only past `max_length` (truncated away): the sigmoid loss then sits
at ln 2 = 0.6931 (−log σ(0)) and no gradient separates the two. Margins that turn negative with accuracy under one
half after being higher: the policy moves toward the rejected answers (columns swapped).

run.likelihood_displacement (DPO): the chosen answers' log-probability against the reference, rewards/chosen / β in
nats, falling while the margin grows — DPO lowering both and the rejected faster (Razin et al. 2024,
"Unintentional Unalignment: Likelihood Displacement in Direct Preference Optimization", arXiv:2410.08847; Pal et al.
2024, "Smaug", arXiv:2402.13228). Common and usually harmless (Rafailov et al. 2024, arXiv:2404.12358): information
past 2 nats; a warning only when the chosen answers lost more than the margin gained and the evaluation pairs'
accuracy fell from its best.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.run_kind import trainers
from workbench.probes.run.series import series
from workbench.probes.run.trainer_state import Mark, TrainingLog, steps_text

SIGNAL = "run.preference_signal"
DISPLACEMENT = "run.likelihood_displacement"
ZERO_MARGIN = 1e-6  # |margin| at or below this: no difference seen (trl logs a float32 mean)
MIN_ROWS = 3  # fewer logged steps: step 1 (policy == reference) and a warm-up step tell nothing
LN2 = math.log(2)
DISPLACED_NATS = 2.0  # the chosen answers under the reference by more than 2 nats: named (info)
HELD_OUT_DROP = 0.05  # the evaluation pairs' accuracy this far under its best: the displacement hurts (warn)


def judge_preference(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    kind = facts.kind
    margins = series(log, "rewards/margins")
    evidence = {"trainer_state": str(facts.state_path), "trainer": kind.name, "recognised_by": kind.evidence}
    if margins is None:
        reason = "no rewards/margins logged" if kind.family == "preference" else f"a {kind.name} run"
        skip = Finding(SIGNAL, "skip", f"Not a preference run's log ({reason})",
                       f"run.preference_signal reads trl's preference trainers (DPO, KTO, ORPO, CPO); {kind.evidence}.",
                       evidence)
        return [skip, Finding(DISPLACEMENT, "skip", skip.title, skip.detail.replace(SIGNAL, DISPLACEMENT),
                              evidence)], []
    return [_signal(log, facts, margins, evidence), _displacement(log, facts, margins, evidence)], _marks(margins)


def _marks(margins) -> list[Mark]:
    flat = np.abs(margins.values) <= ZERO_MARGIN
    return [Mark("rewards/margins", tuple(margins.steps[flat].tolist()), "margin 0")] if flat.all() else []


def no_signal(log: TrainingLog) -> bool:
    """Margins exactly 0 at every logged step after the first (at the first the policy may still be the reference:
    a LoRA starts at B = 0), over at least MIN_ROWS steps."""
    margins = series(log, "rewards/margins")
    return margins is not None and len(margins) >= MIN_ROWS and bool(
        np.all(np.abs(margins.values[1:]) <= ZERO_MARGIN))


def pairs_alike(log: TrainingLog) -> bool:
    """The policy gave chosen and rejected the same log-probability at every step: the same tokens (identical
    pairs, or pairs truncated to the same prefix by max_length)."""
    chosen, rejected = series(log, "logps/chosen"), series(log, "logps/rejected")
    return (chosen is not None and rejected is not None and len(chosen) == len(rejected)
            and bool(np.allclose(chosen.values, rejected.values, rtol=1e-4, atol=1e-4)))


def _config(kind) -> str:
    """The config class the user wrote (DPOConfig, KTOConfig, …)."""
    return trainers()[kind.trainers[0]].config if kind.trainers else "the trainer's config"


def _signal(log: TrainingLog, facts: RunFacts, margins, evidence: dict) -> Finding:
    kind = facts.kind
    loss = log.loss[np.isfinite(log.loss)]
    evidence = {**evidence, "logged_steps": len(margins), "margins_first": float(margins.values[0]),
                "margins_last": float(margins.values[-1])}
    if len(margins) < MIN_ROWS:
        return Finding(SIGNAL, "skip", f"Under {MIN_ROWS} logged steps: too short to judge the margins",
                       "At the first step the policy is still the reference (margins 0 by construction).", evidence)
    if not no_signal(log):
        acc = series(log, "rewards/accuracies")
        return _signal_pass(facts, margins, acc, evidence)
    config = _config(kind)
    if kind.arg("beta") == 0:
        return Finding(
            SIGNAL, "fail", f"No preference signal: beta is 0, so every implicit reward and margin is 0 "
                            f"({len(margins)} logged steps)",
            f"The implicit reward is β·(log π − log π_ref): with {kind.cite('beta')} it is 0 for every completion and "
            f"the loss sits at its zero-margin value whatever the data (trl #1627; {config} does not refuse β = 0). "
            f"{kind.evidence}.", {**evidence, "beta": 0.0, "cause": "beta"},
            f"Set `beta` > 0 in {config} (DPOConfig's default is 0.1; higher keeps the policy nearer the reference).")
    at_ln2 = bool(len(loss)) and bool(np.all(np.abs(loss[1:] - LN2) < 1e-3))
    title = (f"No preference signal: rewards/margins is 0 at every one of {len(margins)} logged steps"
             + (f", the loss fixed at ln 2 = {LN2:.4f}" if at_ln2 else ""))
    same = pairs_alike(log)
    evidence = {**evidence, "loss_at_ln2": at_ln2, "max_length": kind.arg("max_length"),
                "logps_chosen_equal_rejected": same}
    if same and "kto" not in kind.trainers:
        limit = kind.arg("max_length")
        return Finding(
            SIGNAL, "fail", title,
            f"The {kind.name} run logged a margin of exactly 0 between chosen and rejected at every step "
            f"({steps_text(margins.steps)}), and the policy gave the two the same log-probability (logps/chosen == "
            "logps/rejected): each pair's chosen and rejected are the same text, or differ only past the length the "
            f"trainer keeps ({kind.cite('max_length')}; truncation makes them the same tokens). "
            + (f"The loss sits at −log σ(0) = ln 2 = {LN2:.4f} throughout: no gradient separates them. "
               if at_ln2 else "")
            + f"Read from {facts.name(facts.state_path)}; {kind.evidence}.",
            {**evidence, "cause": "pairs"},
            "Check the pairs before training: count rows where `chosen == rejected` (after applying the chat "
            "template) and drop them; tokenize a few pairs and compare them up to "
            f"{'max_length=' + str(limit) if limit else 'max_length'} — if they differ only after it, raise "
            f"`max_length` ({config}) or shorten the prompts so that the answers fit.")
    return Finding(
        SIGNAL, "fail", title,
        f"The {kind.name} run logged a margin of exactly 0 at every step ({steps_text(margins.steps)}) although the "
        "completions it compares differ: the policy never left the reference, so no update reached the weights "
        "that generate (run.gradients and run.adapter_progress say whether any gradient or update landed). "
        f"Read from {facts.name(facts.state_path)}; {kind.evidence}.", {**evidence, "cause": "no update"},
        f"Check that the model has trainable parameters on the forward path (a PeftModel loaded with "
        f"`is_trainable=True`), that `learning_rate` > 0 in {config}, and one training step's gradients (notebook "
        "04's grad.flow).")


def _signal_pass(facts: RunFacts, margins, accuracy, evidence: dict) -> Finding:
    kind = facts.kind
    acc = f", rewards/accuracies {accuracy.start:.2f} → {accuracy.end:.2f}" if accuracy is not None else ""
    return Finding(SIGNAL, "pass", f"The run separates chosen from rejected: {margins.span()}{acc}",
                   f"{kind.name} run, {len(margins)} logged steps read from {facts.name(facts.state_path)}.",
                   evidence)


def _displacement(log: TrainingLog, facts: RunFacts, margins, evidence: dict) -> Finding:
    kind = facts.kind
    chosen = series(log, "rewards/chosen")
    if "dpo" not in kind.trainers or chosen is None or len(chosen) < 5:
        why = ("its rewards are β·log π without a reference" if set(kind.trainers) & {"orpo", "cpo"} else
               "rewards/chosen over desirable examples, not pairs" if "kto" in kind.trainers else
               "rewards/chosen not logged over 5 steps")
        return Finding(DISPLACEMENT, "skip", f"Likelihood displacement not read for this {kind.name} run ({why})",
                       "run.likelihood_displacement reads a DPO run's rewards/chosen = β·(log π − log π_ref) of the "
                       "chosen completions.", evidence)
    beta = kind.arg("beta")
    if beta == 0 or no_signal(log):
        return Finding(DISPLACEMENT, "skip", "Likelihood displacement not read: the run has no preference signal",
                       "run.preference_signal names why the margins stayed 0; displacement needs a margin.",
                       evidence)
    beta_source = kind.cite("beta") if beta is not None else "beta not recorded: DPOConfig's default 0.1 assumed"
    beta = float(beta) if beta is not None else 0.1
    c, m = chosen.end / beta, margins.end / beta  # nats against the reference, summed over the completion
    evidence = {**evidence, "chosen_log_ratio_nats": round(c, 4), "margin_nats": round(m, 4), "beta": beta,
                "rewards_chosen_last_fifth": chosen.end}
    if c >= -DISPLACED_NATS or m <= 0:
        return Finding(DISPLACEMENT, "pass", f"The chosen answers keep their likelihood against the reference: "
                                             f"{c:+.3g} nats at the end, margin {m:+.3g} nats",
                       f"rewards/chosen / β ({beta_source}); {chosen.span()}.", evidence)
    fix = ("Add an SFT term on the chosen answers (`loss_type=[\"sigmoid\", \"sft\"]` with `loss_weights`, trl 1.16 "
           "dpo_config.py:245-259; RPO, arXiv:2404.19733), raise `beta` or lower `learning_rate`, and compare "
           "samples of the last checkpoint with the first.")
    title = (f"The chosen answers lost likelihood while the margin grew: {c:+.3g} nats against the reference, "
             f"margin {m:+.3g} nats")
    detail = (f"rewards/chosen / β ({beta_source}) is the chosen completions' log-probability against the reference: "
              "it fell while the margin grew, so the separation comes from the rejected answers falling faster — "
              "likelihood displacement (Razin et al. 2024, arXiv:2410.08847; Pal et al. 2024, arXiv:2402.13228).")
    accuracy = log.eval_metrics.get("eval_rewards/accuracies")
    held = accuracy[np.isfinite(accuracy)] if accuracy is not None else np.array([])
    # a sustained drop: the last two of three or more evaluations under the best (one dip is small-set noise)
    if c < -max(DISPLACED_NATS, m) and len(held) >= 3 and np.all(held[-2:] < held.max() - HELD_OUT_DROP):
        return Finding(DISPLACEMENT, "warn", title + f"; held-out accuracy fell to {held[-1]:.2f} from {held.max():.2f}",
                       detail + " The chosen answers lost more than the margin gained, and the evaluation pairs' "
                       "accuracy fell from its best: the preferred answers themselves are being unlearned.",
                       {**evidence, "eval_accuracy_best": float(held.max()), "eval_accuracy_last": float(held[-1])},
                       fix)
    return Finding(DISPLACEMENT, "info", title, detail + " Common in DPO and usually harmless (both implicit rewards "
                   "fall while the margin grows; Rafailov et al. 2024, arXiv:2404.12358): named so that a quality drop "
                   "in generations can be traced to it.", evidence, fix)
