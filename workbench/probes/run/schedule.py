"""run.schedule: what the logged learning rate and the step counts say.

trainer_state.json records the learning rate at each logged step, max_steps, num_train_epochs and the epoch reached;
warmup and the scheduler's type come from the model card or (--allow-pickle) training_args.bin when recorded.
"""

from __future__ import annotations

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.trainer_state import Mark, TrainingLog

CHECK = "run.schedule"
# lr_scheduler_type values (transformers 5.23 trainer_utils.SchedulerType) whose schedule decays by max_steps.
# reduce_lr_on_plateau is not one: it lowers the rate only after `patience` evaluations without improvement
# (torch's ReduceLROnPlateau, stepped with the eval metric in Trainer._evaluate), so a constant rate is its contract
# while the metric improves; greedy adapts the same way.
DECAYING = ("linear", "cosine", "cosine_with_restarts", "polynomial", "inverse_sqrt", "cosine_with_min_lr",
            "cosine_warmup_with_min_lr", "warmup_stable_decay")


def judge_schedule(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    have = log.learning_rate_logged & np.isfinite(log.learning_rate)
    evidence = {"trainer_state": str(facts.state_path), "global_step": log.global_step, "max_steps": log.max_steps}
    if not have.any():
        return [Finding(CHECK, "skip", "No learning rate logged", "", evidence)], []
    lr, steps = log.learning_rate[have], log.step[have]
    config = facts.configuration
    findings: list[Finding] = []
    marks: list[Mark] = []
    finished = log.max_steps is not None and log.global_step >= log.max_steps
    if float(np.max(np.abs(lr))) == 0.0:
        findings.append(Finding(CHECK, "fail", f"Learning rate 0 at every logged step ({len(lr)} steps)",
                                "The optimizer never changed a weight.",
                                {**evidence, **({"learning_rate": config.get("learning_rate")}
                                                if config.get("learning_rate") is not None else {})},
                                "Set learning_rate > 0; if it is, a scheduler with warmup_steps far past max_steps "
                                "or a parameter group with lr 0 keeps it there."))
        marks.append(Mark("learning_rate", tuple(steps.tolist()), "lr 0"))
    elif len(lr) >= 3 and bool(np.all(np.diff(lr) >= 0)) and lr[-1] > lr[-2]:  # still rising at the end
        peak = config.get("learning_rate")
        reached = f" ({lr[-1] / peak:.0%} of learning_rate {peak:g})" if peak else ""
        warmup = config.cite("warmup_steps")
        verdict = "warn" if finished else "info"
        findings.append(Finding(
            CHECK, verdict, f"The learning rate rises to the last logged step {steps[-1]}: the run never left its "
                            f"warmup ({lr[-1]:.3g}{reached})",
            f"The learning rate increases at every logged step from {lr[0]:.3g} to {lr[-1]:.3g} at step {steps[-1]}"
            + (f" and the run ended there (max_steps {log.max_steps})" if finished else
               f"; the run stopped at step {log.global_step} of {log.max_steps}") + f". {warmup}.",
            {**evidence, "first_lr": float(lr[0]), "last_lr": float(lr[-1]),
             **({"warmup_steps": config.get("warmup_steps")} if config.get("warmup_steps") is not None else {})},
            f"Make warmup shorter than the run: warmup_steps well below max_steps ({log.max_steps}), e.g. "
            f"{max(1, (log.max_steps or len(lr)) // 10)} (10 %), or warmup_ratio 0.03–0.1."
            if finished else ""))
        marks.append(Mark("learning_rate", (int(steps[-1]),), "still warming up"))
    else:
        scheduler = config.get("lr_scheduler_type")
        peak_at = int(np.argmax(lr))
        after = lr[peak_at:]
        if len(after) >= 3 and float(after.min()) == float(after.max()) and scheduler in DECAYING and finished:
            # The Trainer logs its scheduler's get_last_lr() and steps that scheduler after every optimizer step
            # that was not skipped (transformers 5.23 trainer.py _get_learning_rate, _inner_training_loop): a rate
            # that stays flat to max_steps is a scheduler other than the one lr_scheduler_type builds.
            findings.append(Finding(
                CHECK, "warn", f"The learning rate stays at {after[0]:.3g} from step {steps[peak_at]} to the end "
                               f"although lr_scheduler_type is {scheduler!r}: the scheduler that ran is not the "
                               "recorded one",
                f"{config.cite('lr_scheduler_type')}, which decays the rate by max_steps ({log.max_steps}); the "
                f"logged rate never decreases after step {steps[peak_at]}. The Trainer logs the rate of the scheduler "
                "it steps, so another scheduler ran: one passed as `Trainer(optimizers=(optimizer, scheduler))` or "
                "built by an overridden `create_scheduler` replaces lr_scheduler_type, and the run's records still "
                "name the argument.",
                {**evidence, "lr_scheduler_type": scheduler, "learning_rate": float(after[0]),
                 "flat_from_step": int(steps[peak_at])},
                "If a decay was meant, pass `optimizers=(optimizer, None)` so the Trainer builds "
                f"lr_scheduler_type={scheduler!r} over max_steps, or build your scheduler with the run's max_steps; "
                "if a constant rate was meant, set lr_scheduler_type='constant' so the records say what ran."))
            marks.append(Mark("learning_rate", (int(steps[peak_at]), int(steps[-1])), "never decays"))
    epoch = float(log.state.get("epoch") or (log.epoch[-1] if len(log.epoch) else 0.0))
    if finished and 0 < epoch < 1:
        findings.append(Finding(
            CHECK, "info", f"max_steps {log.max_steps} ended the run at epoch {epoch:.3g}: part of the data was "
                           "never seen",
            f"The run finished its {log.max_steps} steps before one pass over the training set (epoch {epoch:.3g}); "
            + (f"{config.cite('max_steps')}." if config.get("max_steps") is not None else
               f"max_steps {log.max_steps} in {facts.name(facts.state_path)}."),
            {**evidence, "epoch": epoch},
            "If epochs were meant, leave max_steps at -1 and set num_train_epochs (max_steps overrides it)."))
    if not finished and log.max_steps:
        findings.append(Finding(CHECK, "info", f"The run stopped at step {log.global_step} of {log.max_steps}",
                                f"{facts.name(facts.state_path)} is the longest log of the output directory.",
                                evidence, "Resume with `trainer.train(resume_from_checkpoint=True)` if it was cut "
                                "short."))
    if not any(f.verdict in ("fail", "warn") for f in findings):
        peak = int(np.argmax(lr))
        findings.insert(0, Finding(
            CHECK, "pass", f"Learning rate {lr[0]:.3g} → peak {lr[peak]:.3g} at step {steps[peak]} → {lr[-1]:.3g} at "
                           f"step {steps[-1]}", f"{len(lr)} logged steps; epoch {epoch:.3g}.", evidence))
    return findings, marks
