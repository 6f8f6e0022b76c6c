"""run.eval: the evaluations the run logged, against the training loss at the same steps, and the checkpoint to keep.

The training loss logged at step s is the mean over the logging window ending at s; the one logged next covers the
window after s. An evaluation at s is compared with the smaller of the two, so a falling curve alone never makes the
evaluation look lower than training.
"""

from __future__ import annotations

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.trainer_state import Mark, TrainingLog, steps_text

CHECK = "run.eval"
BELOW_RATIO = 0.75  # eval loss under 3/4 of the training loss around it ...
BELOW_MARGIN = 0.25  # ... and at least this many nats under it
RISING_EVALS = 3  # eval loss rising over this many evaluations in a row while training falls: overfitting


def judge_eval(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    have = np.isfinite(log.eval_loss)
    evidence = {"trainer_state": str(facts.state_path), "evaluations": int(have.sum())}
    if set(facts.kind.trainers) & {"grpo", "rloo"}:  # Online DPO's eval_loss is a DPO loss: ranked as usual
        return [_keep_by_reward(log, facts, evidence)], []
    if not have.any():
        return [Finding(CHECK, "info", "No evaluation logged: nothing ranks the checkpoints",
                        f"{facts.name(facts.state_path)} holds no eval_loss; eval_strategy was 'no' or no eval_dataset "
                        "was given.", evidence,
                        "Pass an eval_dataset and eval_strategy='steps' with eval_steps = save_steps, and "
                        "load_best_model_at_end=True to keep the best checkpoint.")], []
    steps, values = log.eval_step[have], log.eval_loss[have]
    findings: list[Finding] = []
    marks: list[Mark] = []
    below = _below_train(log, steps, values)
    if below is not None:
        bad, train = below
        findings.append(Finding(
            CHECK, "warn", f"Eval loss below the training loss at {len(bad)} of {len(steps)} evaluations",
            f"At steps {steps_text(bad)} the eval loss is under {BELOW_RATIO:.0%} of the training loss logged "
            f"around it (e.g. {values[np.isin(steps, bad)][0]:.4g} against {train[0]:.4g} at step {bad[0]}): an "
            "evaluation set easier than the training data — rows of the training set in it (leakage), or an eval "
            "collator that supervises tokens the training collator masks (or the reverse).",
            {**evidence, "steps": bad[:50].tolist(), "eval_loss": values[np.isin(steps, bad)][:50].tolist(),
             "train_loss": train[:50].tolist()},
            "Check that no eval row is in the training set (deduplicate on the text) and that train and eval batches "
            "come from the same collator with the same label masking."))
        marks.append(Mark("eval_loss", tuple(bad.tolist()), "eval < train"))
    if len(steps) == 1 and steps[0] >= log.global_step:
        findings.append(Finding(CHECK, "info", f"One evaluation, at the end (step {steps[0]}): nothing ranks the "
                                "checkpoints", "", evidence,
                                "Evaluate during the run (eval_strategy='steps', eval_steps = save_steps)."))
    rising = _rising(log, steps, values)
    if rising is not None:
        findings.append(Finding(
            CHECK, "warn", f"Eval loss rises over {len(rising)} evaluations (steps {rising[0]}–{rising[-1]}) while "
                           "the training loss falls: overfitting",
            f"eval_loss {', '.join(f'{v:.4g}' for v in values[np.isin(steps, rising)])} at steps "
            f"{steps_text(rising)}.", {**evidence, "steps": rising.tolist()},
            "Keep the checkpoint named below, stop earlier (EarlyStoppingCallback), or regularize."))
        marks.append(Mark("eval_loss", tuple(rising.tolist()), "rising"))
    findings.append(_keep(log, facts, steps, values, evidence))
    return findings, marks


def _train_around(log: TrainingLog, at_steps: np.ndarray) -> np.ndarray:
    """Per step: the smaller of the training losses logged at or before it and the next one after it (NaN: none)."""
    ok = np.isfinite(log.loss) & (log.loss != 0.0)
    steps, loss = log.step[ok], log.loss[ok]
    if not len(steps):
        return np.full(len(at_steps), np.nan)
    at = np.searchsorted(steps, at_steps, side="right")
    before = np.where(at > 0, loss[np.clip(at - 1, 0, len(loss) - 1)], np.inf)
    after = np.where(at < len(loss), loss[np.clip(at, 0, len(loss) - 1)], np.inf)
    return np.minimum(before, after)


def _below_train(log: TrainingLog, steps: np.ndarray, values: np.ndarray):
    train = _train_around(log, steps)
    known = np.isfinite(train)
    bad = known & (values < BELOW_RATIO * train) & (train - values > BELOW_MARGIN)
    if known.sum() < 2 or bad.sum() * 2 < known.sum():  # most evaluations, never a single one
        return None
    return steps[bad], train[bad]


def _rising(log: TrainingLog, steps: np.ndarray, values: np.ndarray):
    if len(values) < RISING_EVALS + 1:
        return None
    tail = values[-(RISING_EVALS + 1):]
    if not bool(np.all(np.diff(tail) > 0)):
        return None
    start, end = _train_around(log, steps[[-RISING_EVALS - 1, -1]])
    if not np.isfinite(start) or not np.isfinite(end) or end >= start:
        return None
    return steps[-(RISING_EVALS + 1):]


def _keep(log: TrainingLog, facts: RunFacts, steps, values, evidence) -> Finding:
    recorded = log.state.get("best_model_checkpoint")
    metric = facts.configuration.get("metric_for_best_model") or "eval_loss"
    if recorded:
        return Finding(CHECK, "pass", f"Checkpoint to keep: {recorded} (best_model_checkpoint, "
                                      f"{metric} {log.state.get('best_metric')})",
                       "The Trainer recorded it (load_best_model_at_end / metric_for_best_model).",
                       {**evidence, "best_model_checkpoint": recorded, "best_metric": log.state.get("best_metric")})
    saved = [(int(s), float(v)) for s, v in zip(steps, values) if int(s) in facts.checkpoints]
    if saved:
        step, value = min(saved, key=lambda sv: sv[1])
        name = facts.name(facts.checkpoints[step])
        return Finding(CHECK, "pass", f"Checkpoint to keep: {name} (lowest eval_loss {value:.4g} of the "
                                      f"{len(saved)} saved at an evaluated step)",
                       "No best_model_checkpoint was recorded; ranked by eval_loss at the steps that have a "
                       "checkpoint-N folder.", {**evidence, "keep": name, "eval_loss": value},
                       "" if step == max(facts.checkpoints) else
                       f"Use {facts.checkpoints[step]} rather than the last save.")
    best = int(np.argmin(values))
    return Finding(CHECK, "info", f"Lowest eval_loss {values[best]:.4g} at step {steps[best]}, but no checkpoint "
                                  "was saved at an evaluated step",
                   f"checkpoints at steps {list(facts.checkpoints)}; evaluations at {steps_text(steps)}.", evidence,
                   "Save where you evaluate (save_steps a multiple of eval_steps) and set load_best_model_at_end.")


def _keep_by_reward(log: TrainingLog, facts: RunFacts, evidence: dict) -> Finding:
    """An online RL run (GRPO, RLOO): its eval_loss is a policy-gradient surrogate near 0 by construction, no measure
    of quality; the checkpoint to keep is the one with the highest `eval_reward` (trl's eval prefix + `reward`)."""
    kind = facts.kind
    rewards = log.eval_metrics.get("eval_reward")
    have = np.isfinite(rewards) if rewards is not None else np.zeros(0, dtype=bool)
    saved = [(int(s), float(v)) for s, v in zip(log.eval_step[have], rewards[have]) if int(s) in facts.checkpoints] \
        if rewards is not None else []
    if not saved:
        return Finding(CHECK, "info", f"No evaluation reward at a saved step: nothing ranks this {kind.name} run's "
                                      "checkpoints",
                       f"A {kind.name} run's eval_loss is a policy-gradient surrogate that sits near 0 (trl #3452), "
                       "not a measure of quality; the checkpoints are ranked by `eval_reward`, which "
                       + ("was not logged." if rewards is None else "no saved step has."), evidence,
                       "Pass an eval_dataset of prompts with eval_strategy='steps' and eval_steps = save_steps: trl "
                       "then logs eval_reward per evaluation.")
    step, value = max(saved, key=lambda sv: sv[1])
    name = facts.name(facts.checkpoints[step])
    return Finding(CHECK, "pass", f"Checkpoint to keep: {name} (highest eval_reward {value:.4g} of the {len(saved)} "
                                  "saved at an evaluated step)",
                   f"A {kind.name} run is ranked by eval_reward, not eval_loss (a surrogate near 0).",
                   {**evidence, "keep": name, "eval_reward": value},
                   "" if step == max(facts.checkpoints) else f"Use {facts.checkpoints[step]} rather than the last save.")
