"""train.rl_rollout: one generation batch of a GRPO or RLOO run, generated and scored by the trainer itself before
its first step — the reward functions' outputs and where the completions stop, while the run can still be fixed.

The trainer's own code does the work: its dataloader builds the first generation batch (`RepeatSampler`: each
prompt `num_generations` times), and `_generate_and_score_completions` generates, calls every reward function as
training will and computes the advantages (trl 1.16 grpo_trainer.py:2324; rloo_trainer.py:1458). That method
appends to the trainer's metrics (`_metrics`), its completions table (`_logs`) and its token count: the probe reads
what it appended — `rewards/<name>/mean` and `/std`, `frac_reward_zero_std`, `completions/clipped_ratio`,
`completions/mean_length` — and puts all three back as they were, so the run's first logged step is its own.

One batch before any update is a sample, not the run: every function returning one value for every completion, or
every completion cut at `max_completion_length`, is a `warn` (a hard first batch can score all zeros under a 0/1
reward); the run autopsy's `run.reward_variance` and `run.completion_clipping` judge the whole run.
"""

from __future__ import annotations

import copy
import dataclasses

from workbench.display.nodes import Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.errors import NotApplicable
from workbench.findings import Finding, combine_findings

CHECK = "train.rl_rollout"
TRAINERS = ("GRPOTrainer", "RLOOTrainer")
MANY_ALIKE = 0.5  # half of the batch's groups or more with one reward: named (info)


@dataclasses.dataclass(repr=False)
class RolloutResult(ProbeResult):
    trainer: str
    metrics: dict[str, float]  # what the scored batch appended to the trainer's metrics
    functions: dict[str, tuple[float, float]]  # reward function -> (mean, std) over the batch
    completions: int
    max_completion_length: int | None

    def findings(self) -> list[Finding]:
        m = self.metrics
        evidence = {"trainer": self.trainer, "completions": self.completions, "metrics": m,
                    "reward_functions": {k: {"mean": v[0], "std": v[1]} for k, v in self.functions.items()},
                    "max_completion_length": self.max_completion_length}
        found: list[Finding] = []
        constant = [name for name, (_, std) in self.functions.items() if std == 0.0]
        if self.functions and len(constant) == len(self.functions):
            values = ", ".join(f"`{name}` → {self.functions[name][0]:.4g}" for name in constant)
            found.append(Finding(
                CHECK, "warn", f"Every reward function returned one value for all {self.completions} completions of "
                               f"the first batch: {values}",
                f"The {self.trainer} generated the first generation batch and scored it with its own code before "
                "training: no completion scored differently from another, so every advantage of this batch is zero. "
                "If the whole run is like this, it learns nothing (the autopsy's run.reward_variance).", evidence,
                f"Call {', '.join(f'`{n}`' for n in constant)} on a few of these completions by hand: a function that "
                "returns a constant, reads a dataset column that is missing, or expects a format the model never "
                "writes (a tag, a boxed answer) scores everything alike; with a 0/1 reward on hard prompts, start "
                "from an SFT model or grade the reward."))
        clipped = m.get("completions/clipped_ratio")
        if clipped is not None and clipped >= 1.0:
            found.append(Finding(
                CHECK, "warn", f"Every completion of the first batch ran to max_completion_length="
                               f"{self.max_completion_length} without an EOS token",
                f"completions/mean_length {m.get('completions/mean_length', float('nan')):.4g}: the model does not end "
                "its answers within the limit, so every reward would judge cut-off text.", evidence,
                "Check that the model writes the tokenizer's EOS (or that the chat template's end-of-turn token is in "
                "`generation_config.eos_token_id`); raise `max_completion_length`; set "
                "`mask_truncated_completions=True`."))
        alike = m.get("frac_reward_zero_std")
        if not found and alike is not None and alike >= MANY_ALIKE:
            found.append(Finding(
                CHECK, "info", f"{alike:.0%} of the first batch's prompt groups got one reward for all completions",
                "Their advantages are zero: usual with a 0/1 reward and few generations; the run autopsy "
                "(run.reward_variance) reads the whole run.", evidence,
                "Raise `num_generations`, or filter prompts the model always or never solves."))
        if found:
            return [combine_findings(found)]
        means = ", ".join(f"`{k}` {v[0]:.3g} ± {v[1]:.3g}" for k, v in self.functions.items())
        return [Finding(CHECK, "pass", f"The first batch's rewards vary and its completions end: {means}",
                        f"{self.completions} completions; completions/clipped_ratio {clipped}, mean length "
                        f"{m.get('completions/mean_length')}.", evidence)]

    def view(self):
        rows = [[name, f"{mean:.4g}", f"{std:.4g}"] for name, (mean, std) in self.functions.items()]
        return Display(Paragraph(f"One generation batch of your {self.trainer} ({self.completions} completions), "
                                 "scored by its own reward functions before the first step."),
                       Table(["reward function", "mean", "std"], rows, left=True),
                       Table(None, [[k, f"{v:.4g}"] for k, v in sorted(self.metrics.items())], row_headers=True,
                             left=True))


def rl_rollout_probe(configuration) -> RolloutResult:
    trainer = getattr(configuration, "trainer", None)
    if trainer is None or type(trainer).__name__ not in TRAINERS and not any(
            c.__name__ in TRAINERS for c in type(trainer).__mro__):
        raise NotApplicable(f"the configuration ({getattr(configuration, 'source', 'none')}) holds no GRPO or RLOO "
                            "trainer: nothing generates", "not a GRPO or RLOO trainer")
    from workbench.model.accelerate_state import as_launched, shared_states

    saved = {name: copy.deepcopy(getattr(trainer, name)) for name in ("_metrics", "_logs") if hasattr(trainer, name)}
    tokens_seen = trainer.state.num_input_tokens_seen
    before = {mode: {k: len(v) for k, v in values.items()} for mode, values in trainer._metrics.items()}
    try:
        with as_launched() as live:
            if not live and "distributed_type" not in shared_states()[1]:
                raise NotApplicable(f"your {type(trainer).__name__}'s accelerator state was reset by an earlier "
                                    "check's TrainingArguments in this process: the training callback "
                                    "(WorkbenchCallback) scores the first batch before the run",
                                    "the trainer cannot generate here")
            batch = next(iter(trainer.get_train_dataloader()))
            trainer._generate_and_score_completions(batch)
            mode = "train" if trainer.model.training else "eval"
            appended = {k: v[before.get(mode, {}).get(k, 0):] for k, v in trainer._metrics[mode].items()}
            metrics = {k: float(v[-1]) for k, v in appended.items() if v and isinstance(v[-1], (int, float))}
    finally:
        for name, value in saved.items():
            setattr(trainer, name, value)
        trainer.state.num_input_tokens_seen = tokens_seen
    functions = {}
    for key in metrics:
        if key.startswith("rewards/") and key.endswith("/mean"):
            name = key[len("rewards/"):-len("/mean")]
            functions[name] = (metrics[key], metrics.get(f"rewards/{name}/std", float("nan")))
    return RolloutResult(type(trainer).__name__, metrics, functions, len(batch),
                         getattr(trainer.args, "max_completion_length", None))
