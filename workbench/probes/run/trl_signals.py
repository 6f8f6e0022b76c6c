"""Notebook 08's preference and RL step: the run read by the signals its trainer logs (trl's DPO/KTO/ORPO/CPO
margins and log-probabilities, GRPO/RLOO rewards, completions, KL and entropy, a reward model's accuracy), with the
curves of those signals as the result's figure. A plain Trainer (SFT) run: every check here skips."""

from __future__ import annotations

import dataclasses

from workbench.probes.run.log_probe import TrainingLogResult, judge_run
from workbench.probes.run.online_rl_signals import judge_online_rl
from workbench.probes.run.preference_signals import judge_preference
from workbench.probes.run.reward_model_signals import judge_reward_model
from workbench.probes.run.run_kind import RunKind
from workbench.probes.run.series import series

JUDGES = (judge_preference, judge_online_rl, judge_reward_model)
# the signals drawn per family, in this order
CURVES = {"preference": ("rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected"),
          "online_rl": ("reward", "frac_reward_zero_std", "completions/clipped_ratio", "kl", "entropy"),
          "reward": ("accuracy", "margin")}


@dataclasses.dataclass(repr=False)
class RunSignalsResult(TrainingLogResult):
    """The log step's result shape (facts, log, judged, marks), judged by the trainer's own signals."""

    @property
    def kind(self) -> RunKind:
        return self.facts.kind

    def summary(self) -> list[list[str]]:
        kind, log = self.kind, self.log
        rows = [["trainer", kind.name], ["recognised by", kind.evidence]]
        for key in CURVES.get(kind.family, ()):
            found = series(log, key)
            if found is not None:
                rows.append([key, f"{found.start:.4g} → {found.end:.4g} (first and last fifth, {len(found)} steps)"])
        for key in ("beta", "num_generations", "max_completion_length", "max_length", "loss_type", "scale_rewards"):
            if key in kind.args:
                rows.append([key, kind.cite(key)])
        return rows

    def details(self):
        from workbench.display.findings_view import figure
        from workbench.display.nodes import Display, Table

        keys = [k for k in CURVES.get(self.kind.family, ()) if series(self.log, k) is not None]
        plot = figure(lambda: self.plot(keys), f"{', '.join(keys)} against step") if keys else None
        return Display(plot, Table(None, self.summary(), row_headers=True, left=True))

    def plot(self, keys):
        """One panel per signal, sharing the step axis; the judges' marks on their signal's panel."""
        import numpy as np
        from matplotlib.figure import Figure

        fig = Figure(figsize=(3.2 * len(keys), 2.6))
        axes = fig.subplots(1, len(keys), squeeze=False)
        for ax, key in zip(axes[0], keys):
            found = series(self.log, key)
            ax.plot(found.steps, found.values, lw=1.2)
            for mark in (m for m in self.marks if m.series == key):
                at = np.isin(found.steps, mark.steps)
                ax.plot(found.steps[at], found.values[at], "v", color="#c62828", ms=5, mfc="none", label=mark.label)
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        return fig


def run_signals_probe(training_log: TrainingLogResult) -> RunSignalsResult:
    """Judge the run by its trainer's own signals (the trainer recognised by the `training_log` step)."""
    facts, log = training_log.facts, training_log.log
    return RunSignalsResult(facts, log, *judge_run(log, facts, JUDGES))

