"""Online RL runs (trl's GRPO and RLOO) read by their own keys (trl 1.16 grpo_trainer.py:2296-2310, 2828-2830,
3268-3283; rloo_trainer.py:1437-1454, 1716-1728).

run.reward_variance — `frac_reward_zero_std` is the share of prompt groups whose `num_generations` completions all
got the same reward. Such a group's advantages (reward − group mean, scaled) are all zero: it gives no policy
gradient. At 1.0 on every logged step nothing is learned (a reward function that returns a constant, or ignores
the completion); the per-function columns `rewards/<name>/std` name the function. A high share over the run (half
the groups or more) wastes most of the generation: DAPO's dynamic sampling filters such groups (Yu et al. 2025,
arXiv:2503.14476, §3.2), a graded reward or more generations give them signal.

run.completion_clipping — `completions/clipped_ratio` is the share of completions that reached
`max_completion_length` without an EOS token. At 1.0 every reward judged a cut-off text; a majority clipped at the
end of the run: answers the length does not hold (DAPO §3.3, overlong filtering; trl's
`mask_truncated_completions`).

run.policy_drift — the KL to the reference (`kl`, logged when `beta` > 0) and the token entropy (`entropy`). A KL of
exactly 0 at every step while the rewards vary: the policy never leaves the reference (the reference is the policy
itself, or no update lands). Entropy falling under a tenth of its start: the policy collapses onto few tokens, and
exploration with it (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617). A KL that grows past 10× its early median and ends above 1 nat per token: the policy
runs away from the reference.

run.reward_trend — the mean `reward`: falling over the run (warn), or rising in lockstep with
`completions/mean_length` (information: length hacking and a task that needs length look alike in a log).
"""

from __future__ import annotations

import numpy as np

from workbench.findings import Finding
from workbench.probes.run.run_facts import RunFacts
from workbench.probes.run.series import series
from workbench.probes.run.trainer_state import Mark, TrainingLog, steps_text

VARIANCE = "run.reward_variance"
CLIPPING = "run.completion_clipping"
DRIFT = "run.policy_drift"
TREND = "run.reward_trend"
NO_SIGNAL_SHARE = 0.5  # half of the groups or more with one reward, averaged over the run: info
NO_SIGNAL_END = 0.9  # nine groups in ten alike over the last fifth: warn
MIN_ROWS = 3  # fewer logged steps: a cold start or step 1 (policy == reference) tells nothing
CLIPPED_SHARE = 0.2  # the last fifth's median clipped ratio at or above this, not masked out of the loss: warn
CLIPPED_NOTED = 0.05  # a few percent cut: named (info)
ENTROPY_COLLAPSE = 0.1  # the last fifth's entropy under a tenth of the first fifth's
KL_GROWTH, KL_HIGH = 10.0, 1.0  # KL beyond 10× its first fifth and above 1 nat per token
TREND_POINTS = 10  # fewer logged rewards than this: too short to call a trend
LENGTH_TRACKS, LENGTH_GROWTH = 0.8, 1.5  # reward and mean length correlated ≥ 0.8 while the length grew ≥ 1.5×


def judge_online_rl(log: TrainingLog, facts: RunFacts) -> tuple[list[Finding], list[Mark]]:
    kind = facts.kind
    evidence = {"trainer_state": str(facts.state_path), "trainer": kind.name, "recognised_by": kind.evidence}
    if kind.family != "online_rl" or not set(kind.trainers) & {"grpo", "rloo"}:
        title = (f"Not an online RL run ({kind.name})" if kind.family != "online_rl" else
                 f"Not a GRPO or RLOO run ({kind.name} logs objective/* keys, read by run.preference_signal)")
        detail = f"read for trl's GRPO and RLOO runs; {kind.evidence}."
        return [Finding(check, "skip", title, f"{check} is {detail}", evidence)
                for check in (VARIANCE, CLIPPING, DRIFT, TREND)], []
    marks: list[Mark] = []
    variance, silent = _variance(log, facts, evidence)
    marks += silent
    return [variance, _clipping(log, facts, evidence), _drift(log, facts, evidence, variance),
            _trend(log, facts, evidence)], marks


def _reward_functions(log: TrainingLog) -> dict[str, float]:
    """Each reward function's largest logged std across the run (`rewards/<name>/std`)."""
    out = {}
    for key in log.metrics:  # the keys alone: a column is built when read
        if key.startswith("rewards/") and key.endswith("/std"):
            column = log.metrics[key]
            finite = column[np.isfinite(column)]
            if len(finite):
                out[key[len("rewards/"):-len("/std")]] = float(finite.max())
    return out


def _penalised(kind) -> bool:
    """RLOO with beta > 0 (its default is 0.05) computes frac_reward_zero_std on the KL-penalised reward
    (rloo_trainer.py:1663-1700): after the first step it says nothing about the task reward."""
    beta = kind.arg("beta")
    return "rloo" in kind.trainers and (beta is None or beta > 0)


def no_reward_variance(log: TrainingLog, kind) -> bool:
    """No group ever differed: frac_reward_zero_std 1.0 at every one of ≥ MIN_ROWS logged steps (not read for an
    RLOO run with a KL penalty), or every reward function's std 0 throughout."""
    functions = _reward_functions(log)
    if functions and all(std == 0.0 for std in functions.values()):
        zero = series(log, "frac_reward_zero_std")
        return zero is None or len(zero) >= MIN_ROWS
    zero = series(log, "frac_reward_zero_std")
    return (zero is not None and len(zero) >= MIN_ROWS and not _penalised(kind)
            and bool(np.all(zero.values >= 1.0)))


def _variance(log: TrainingLog, facts: RunFacts, evidence: dict) -> tuple[Finding, list[Mark]]:
    kind = facts.kind
    zero = series(log, "frac_reward_zero_std")
    if zero is None:
        return Finding(VARIANCE, "skip", "frac_reward_zero_std not logged",
                       f"The {kind.name} log holds no frac_reward_zero_std (trl ≥ 0.17 logs it).", evidence), []
    functions = _reward_functions(log)
    constant = [name for name, std in functions.items() if std == 0.0]
    if len(zero) < MIN_ROWS:
        return Finding(VARIANCE, "skip", f"Under {MIN_ROWS} logged steps: too short to judge the rewards' variance",
                       f"{len(zero)} logged steps; a cold start can give every group one reward.", evidence), []
    unit = ("batches" if kind.arg("scale_rewards") == "batch" else "prompt groups")  # batch scaling: 0/1 per batch
    generations = kind.cite("num_generations")
    evidence = {**evidence, "frac_reward_zero_std_mean": round(float(zero.values.mean()), 4),
                "logged_steps": len(zero), "reward_functions_max_std": functions,
                "num_generations": kind.arg("num_generations")}
    named = (f" The reward function(s) {', '.join(constant)} never varied (rewards/<name>/std 0 at every step)."
             if constant else "")
    if no_reward_variance(log, kind):
        every_group_alike = bool(np.all(zero.values >= 1.0)) and not _penalised(kind)
        fix_target = ", ".join(f"`{name}`" for name in constant) or "the reward function"
        why = ("frac_reward_zero_std 1.0" if every_group_alike else
               "every reward function's std 0 across each batch")
        return Finding(
            VARIANCE, "fail", f"No reward signal: every completion of a group got the same reward at all "
                              f"{len(zero)} logged steps ({why})",
            f"In every prompt group the {kind.arg('num_generations') or 'num_generations'} completions were scored "
            "alike, so every advantage is zero and the policy gradient with it: the run cannot learn, whatever its "
            f"loss shows — a GRPO loss near 0 is normal, this is not (steps {steps_text(zero.steps)}).{named} "
            f"{generations}. Read from {facts.name(facts.state_path)}; {kind.evidence}.",
            evidence,
            f"Call {fix_target} on a few completions of one prompt and check that the scores differ: a function "
            "that returns a constant, reads a column the dataset does not have, or compares against a format the "
            "model never writes gives every completion the same score. With a binary reward, raise "
            "`num_generations` or make the reward graded so that some groups differ."), \
            [Mark("frac_reward_zero_std", tuple(zero.steps.tolist()), "rewards without variance")]
    if _penalised(kind):
        return Finding(VARIANCE, "skip", "frac_reward_zero_std of an RLOO run with a KL penalty: not the task reward's",
                       f"RLOO computes it on the reward minus β·KL ({kind.cite('beta')}; RLOOConfig's default 0.05): "
                       "after the first step it is near 0 whatever the reward functions return; each function's "
                       "rewards/<name>/std varies, so no constant function is named.", evidence), []
    share, end = float(zero.values.mean()), zero.end
    expected = _binary_expectation(log, kind.arg("num_generations"))
    if end >= NO_SIGNAL_END:
        return Finding(
            VARIANCE, "warn", f"Almost none of the {unit} gives a signal at the end of the run: frac_reward_zero_std "
                              f"{zero.start:.2f} → {end:.2f}",
            f"Over the last fifth of {len(zero)} logged steps {end:.0%} of the {unit} had completions all scored "
            f"alike (zero advantage: nothing learned from them).{named} {generations}.{expected} The prompts are "
            "solved always or never (DAPO, arXiv:2503.14476, dynamic sampling).", evidence,
            "Filter the prompts the model always or never solves, raise `num_generations`, or grade the reward "
            "(partial credit) so that groups differ; trl has no dynamic sampling (trl #3708)."), []
    if share >= NO_SIGNAL_SHARE:
        return Finding(
            VARIANCE, "info", f"{share:.0%} of the {unit} gave no signal on average "
                              f"(frac_reward_zero_std {zero.start:.2f} → {end:.2f})",
            f"A group whose completions all got the same reward has zero advantages; {share:.0%} of the groups, "
            f"averaged over {len(zero)} logged steps.{named} {generations}.{expected} Expected with a binary reward "
            "and few generations; compute spent on them trains nothing.", evidence,
            "Raise `num_generations`, or filter prompts the model always or never solves."), []
    return Finding(VARIANCE, "pass", f"The rewards vary within the groups: frac_reward_zero_std {share:.2f} on "
                                     f"average ({zero.start:.2f} → {end:.2f})",
                   f"{len(zero)} logged steps; {generations}.", evidence), []


def _binary_expectation(log: TrainingLog, generations) -> str:
    """With a 0/1 reward of mean p, a group of G is all alike with probability p^G + (1 − p)^G: said when the
    logged reward lies in [0, 1] and G is recorded."""
    reward = series(log, "reward")
    if reward is None or not generations or not (0 <= reward.values.min() and reward.values.max() <= 1):
        return ""
    p = float(np.clip(reward.end, 0, 1))
    alike = p ** generations + (1 - p) ** generations
    return (f" If the reward is 0/1, a mean of {p:.2f} over groups of {generations} gives {alike:.0%} such groups "
            "by chance alone.")


def _clipping(log: TrainingLog, facts: RunFacts, evidence: dict) -> Finding:
    kind = facts.kind
    clipped = series(log, "completions/clipped_ratio")
    if clipped is None:
        return Finding(CLIPPING, "skip", "completions/clipped_ratio not logged",
                       f"The {kind.name} log holds no completions/clipped_ratio.", evidence)
    length = series(log, "completions/mean_length")
    limit = kind.arg("max_completion_length")
    evidence = {**evidence, "clipped_ratio_last_fifth": clipped.end, "logged_steps": len(clipped),
                "max_completion_length": limit,
                "mean_length_last_fifth": length.end if length is not None else None}
    lengths = f"; completions/mean_length {length.start:.4g} → {length.end:.4g}" if length is not None else ""
    cited = kind.cite("max_completion_length")
    raise_to = f"raise `max_completion_length` (now {limit})" if limit else "raise `max_completion_length`"
    fix = ("Generate from one prompt and read where the completion stops: if it never writes the EOS token "
           "(the tokenizer's eos_token, or the chat template's end-of-turn token missing from "
           "`generation_config.eos_token_id`), fix that first; else " + raise_to + ", and set "
           "`mask_truncated_completions=True` so cut-off completions do not enter the loss.")
    if np.all(clipped.values >= 1.0) or clipped.end >= 0.9:
        return Finding(
            CLIPPING, "fail", (f"Every completion was cut off: completions/clipped_ratio 1.0 at all {len(clipped)} "
                               "logged steps" if np.all(clipped.values >= 1.0) else
                               f"Nearly every completion is cut off at the end of the run: {clipped.span()}"),
            ("No completion" if np.all(clipped.values >= 1.0) else f"Over the last fifth, {1 - clipped.end:.0%} of the "
             "completions at most") + f" ended with an EOS token before the length limit ({cited}){lengths}: "
            f"the rewards judged truncated text. Read from {facts.name(facts.state_path)}; {kind.evidence}.",
            evidence, fix)
    masked = kind.arg("mask_truncated_completions") is True
    if clipped.end >= CLIPPED_SHARE and not masked:
        return Finding(
            CLIPPING, "warn", f"Most completions are cut off at the end of the run: {clipped.span()}",
            f"{clipped.end:.0%} of the completions reached the length limit ({cited}) without an EOS token over the "
            f"last fifth of the run{lengths}: their rewards judge text that was cut off (DAPO, arXiv:2503.14476, "
            "§3.3).", evidence, fix)
    if clipped.end >= CLIPPED_NOTED:
        return Finding(CLIPPING, "info", f"Some completions are cut off: {clipped.span()}",
                       f"{cited}{lengths}; " + ("`mask_truncated_completions=True` keeps them out of the loss."
                                               if masked else "their rewards judge text that was cut off."),
                       evidence, fix)
    return Finding(CLIPPING, "pass", f"Completions end before the limit: {clipped.span()}",
                   f"{cited}{lengths}.", evidence)


def _drift(log: TrainingLog, facts: RunFacts, evidence: dict, variance: Finding) -> Finding:
    kind = facts.kind
    kl, entropy = series(log, "kl"), series(log, "entropy")
    if kl is None and entropy is None:
        return Finding(DRIFT, "skip", "Neither kl nor entropy logged",
                       f"The {kind.name} log holds no kl (logged when beta > 0; {kind.cite('beta')}) and no entropy.",
                       evidence)
    found: list[Finding] = []
    if kl is not None:
        evidence = {**evidence, "kl_first_fifth": kl.start, "kl_last_fifth": kl.end, "beta": kind.arg("beta")}
        if len(kl) >= MIN_ROWS and np.all(kl.values[1:] == 0.0) and variance.verdict != "fail":
            found.append(Finding(
                DRIFT, "warn", f"KL to the reference is exactly 0 at all {len(kl)} logged steps while the rewards "
                               "vary",
                f"With {kind.cite('beta')} the loss pulls toward a reference, but the logged KL never leaves 0: the "
                "reference is the policy itself (a reference synchronised every step, or an adapter whose disabled "
                "base is not what generates), or no update reaches the weights that generate.", evidence,
                "Check that the reference differs from the policy after one step (`sync_ref_model`, "
                "`ref_model_sync_steps`, `ref_model_mixup_alpha`), and that the trained adapter is active in "
                "generation; run.gradients and run.adapter_progress say whether updates landed."))
        elif kl.end > KL_HIGH and kl.end > KL_GROWTH * max(kl.start, 1e-6):
            found.append(Finding(
                DRIFT, "warn", f"The policy runs away from the reference: {kl.span()}",
                f"The per-token KL grew past {KL_GROWTH:g}× its early median and ends above {KL_HIGH:g} nat: the "
                f"policy drifts far from the reference ({kind.cite('beta')}), where rewards are often gamed.",
                evidence, "Raise `beta`, lower `learning_rate`, and read samples of the last checkpoint next to "
                          "its rewards."))
    if entropy is not None and len(entropy) >= 5:
        evidence = {**evidence, "entropy_first_fifth": entropy.start, "entropy_last_fifth": entropy.end}
        reward = series(log, "reward")
        improving = reward is not None and len(reward) >= 10 and reward.end > float(
            np.median(reward.values[-2 * reward.fifth:-reward.fifth]))
        # a reward at its best (a finished run, every answer right) needs no more exploration
        saturated = reward is not None and reward.end >= float(reward.values.max()) - 0.05 * (
            float(reward.values.max()) - float(reward.values.min()))
        improving = improving or saturated
        bonus = ("add an entropy bonus (`entropy_coef` > 0, or `use_adaptive_entropy=True`; trl 1.16 "
                 "grpo_config.py:291-299)" if "grpo" in kind.trainers else
                 "clip higher (`epsilon_high`, e.g. 0.28: DAPO's Clip-Higher)")
        if entropy.start > 0 and entropy.end < ENTROPY_COLLAPSE * entropy.start:
            found.append(Finding(
                DRIFT, "info" if improving else "warn", f"Entropy collapsed: {entropy.span()}"
                + (" while the reward still improves or holds its best" if improving else ""),
                f"The token entropy of the completions fell under {ENTROPY_COLLAPSE:.0%} of its start: the policy "
                "samples nearly the same tokens every time, the groups stop differing and learning stalls (Cui et "
                "al. 2025, arXiv:2505.22617).", evidence,
                f"Raise `temperature`, lower `learning_rate`, or {bonus}; watch frac_reward_zero_std rise with it."))
    if found:
        from workbench.findings import combine_findings

        return combine_findings(found)
    parts = [kl.span() if kl is not None else None, entropy.span() if entropy is not None else None]
    return Finding(DRIFT, "pass", "The policy stays near its reference and keeps its entropy",
                   "; ".join(p for p in parts if p) + ".", evidence)


def _trend(log: TrainingLog, facts: RunFacts, evidence: dict) -> Finding:
    """The mean reward over the run: falling (the policy gets worse at what it optimises), or rising in lockstep
    with the completions' length (Singhal et al. 2023, "A Long Way to Go: Investigating Length Correlations in
    RLHF", arXiv:2310.03716) — information: a length-rewarding judge and a task that needs longer answers look alike
    in a log."""
    kind = facts.kind
    reward, length = series(log, "reward"), series(log, "completions/mean_length")
    if reward is None or len(reward) < TREND_POINTS:
        return Finding(TREND, "skip", f"Under {TREND_POINTS} logged rewards: too short to read a trend",
                       f"The {kind.name} log holds {len(reward) if reward is not None else 0} `reward` values.",
                       evidence)
    spread = float(np.std(reward.values[:reward.fifth]))
    evidence = {**evidence, "reward_first_fifth": reward.start, "reward_last_fifth": reward.end,
                "reward_first_fifth_std": spread}
    if reward.end < reward.start - max(2 * spread, 0.1 * abs(reward.start), 1e-6):
        return Finding(
            TREND, "warn", f"The reward falls over the run: {reward.span()}",
            f"The policy ends worse at the reward it optimises than it started (more than twice the first fifth's "
            f"spread, {spread:.3g}, below it): updates too large for the policy ({kind.cite('learning_rate')}), a "
            "reward that changed during the run, or collapse after over-optimisation.", evidence,
            "Resume from the checkpoint with the highest reward at a lower `learning_rate` (or a larger `beta`), and "
            "read completions of the first and last checkpoints side by side.")
    if length is not None and len(length) == len(reward) and length.start > 0:
        grew = length.end / length.start
        tracks = float(np.corrcoef(reward.values, length.values)[0, 1]) if np.std(length.values) > 0 and \
            np.std(reward.values) > 0 else 0.0
        evidence = {**evidence, "length_growth": round(grew, 3), "reward_length_correlation": round(tracks, 3)}
        if grew >= LENGTH_GROWTH and tracks >= LENGTH_TRACKS and reward.end > reward.start:
            return Finding(
                TREND, "info", f"The reward rises with the completions' length: correlation {tracks:.2f}, length "
                               f"×{grew:.2f} ({length.start:.4g} → {length.end:.4g} tokens)",
                "Reward and completions/mean_length move together over the run: the policy may be learning to write "
                "longer rather than better (length hacking; Singhal et al. 2023, arXiv:2310.03716) — or the task "
                "needs longer answers (long reasoning grows by design).", evidence,
                "Read completions of the first and last checkpoints side by side; if the extra length adds nothing, "
                "add a length penalty to `reward_funcs` (trl's `get_soft_overlong_punishment`) or score a "
                "length-controlled reward.")
    return Finding(TREND, "pass", f"The reward holds or rises: {reward.span()}", f"{kind.name} run.", evidence)
