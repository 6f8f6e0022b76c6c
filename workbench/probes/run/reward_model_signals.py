"""Reward-model runs (trl's RewardTrainer): `accuracy` (the share of pairs whose chosen completion scores higher) and
`margin` on the training batches, `eval_accuracy` on the evaluation pairs (trl 1.16 reward_trainer.py:800-815).

run.reward_model — at chance (≤ 0.55 at the end of training and at the last evaluation): the model does not tell
chosen from rejected, and a policy trained on it optimises noise. Training pairs separated (≥ 0.9) while the
evaluation pairs stay 0.2 below: it learned the training pairs, not the preference.
"""

from __future__ import annotations

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.series import series
from workbench.probes.run.trainer_state import Mark, TrainingLog

CHECK = "run.reward_model"
CHANCE = 0.55  # accuracy at or under this at the end: no better than a coin on pairs
OVERFIT_TRAIN, OVERFIT_GAP = 0.9, 0.2


def judge_reward_model(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    kind = facts.kind
    evidence = {"trainer_state": str(facts.state_path), "trainer": kind.name, "recognised_by": kind.evidence}
    accuracy = series(log, "accuracy")
    if kind.family != "reward" or accuracy is None:
        return [Finding(CHECK, "skip", f"Not a reward-model run ({kind.name})",
                        f"run.reward_model reads trl's RewardTrainer log (accuracy, margin); {kind.evidence}.",
                        evidence)], []
    evals = log.eval_metrics.get("eval_accuracy")
    last_eval = float(evals[np.isfinite(evals)][-1]) if evals is not None and np.isfinite(evals).any() else None
    evidence = {**evidence, "accuracy_last_fifth": accuracy.end, "eval_accuracy_last": last_eval}
    judged = "the last evaluation" if last_eval is not None else "the training batches"
    final = last_eval if last_eval is not None else accuracy.end
    if final <= CHANCE and accuracy.end <= CHANCE:
        return [Finding(CHECK, "fail", f"The reward model is at chance: accuracy {final:.2f} on {judged}",
                        f"{accuracy.span()}: it scores the chosen completion higher for about half the pairs, as a "
                        "coin would; a policy trained against it optimises noise.", evidence,
                        "Check the pairs (chosen and rejected swapped, identical, or truncated to the same tokens "
                        "by `max_length`), the learning rate (too low to move a fresh score head), and that the "
                        "score head is trained (modules_to_save with a LoRA).")], []
    if last_eval is not None and accuracy.end >= OVERFIT_TRAIN and last_eval < accuracy.end - OVERFIT_GAP:
        return [Finding(CHECK, "warn", f"The reward model separates its training pairs ({accuracy.end:.2f}) but "
                                       f"not the evaluation pairs ({last_eval:.2f})",
                        f"{accuracy.span()}; eval_accuracy {last_eval:.2f} at the last evaluation: it learned the "
                        "training pairs rather than the preference.", evidence,
                        "Stop at the checkpoint with the best eval_accuracy (`metric_for_best_model=\"accuracy\"`, "
                        "`load_best_model_at_end=True`), train fewer epochs, or add pairs.")], []
    return [Finding(CHECK, "pass", f"The reward model separates the pairs: accuracy {final:.2f} on {judged}",
                    accuracy.span() + ".", evidence)], []
