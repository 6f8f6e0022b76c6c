"""The trl runs of `trl_runs.py` really carry the signal each was planted with: every builder trains a real trl
trainer once per session (conftest's `trl_runs_built`, on first use), and its trainer_state.json's log_history is
read back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import trl_runs

pytestmark = pytest.mark.slow

STEPS = 10  # every builder's max_steps
SAVES = (5, 10)  # save_steps 5


def history(output_dir: Path) -> list[dict]:
    """The per-step log lines (the closing train_runtime summary left out)."""
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [e for e in state["log_history"] if "loss" in e]


def series(output_dir: Path, key: str) -> list[float]:
    values = [e[key] for e in history(output_dir)]
    assert len(values) == STEPS, f"{key} logged {len(values)} times, not once per step"
    return values


@pytest.mark.parametrize("name", sorted(trl_runs.BUILDERS))
def test_each_run_finishes_with_its_files(trl_runs_built, name):
    out = trl_runs_built[name]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS and state["max_steps"] == STEPS
    assert "train_runtime" in state["log_history"][-1]
    assert [e["step"] for e in history(out)] == list(range(1, STEPS + 1))
    for step in SAVES:
        assert (out / f"checkpoint-{step}" / "trainer_state.json").is_file()
    for file in ("README.md", "training_args.bin", "tokenizer_config.json"):
        assert (out / file).is_file(), file
    assert (out / "adapter_config.json").is_file() or (out / "model.safetensors").is_file()
    assert "trl" in (out / "README.md").read_text()


# ------------------------------------------------------------------------------------------------------------ DPO
def test_dpo_healthy_separates_the_pairs(trl_runs_built):
    out = trl_runs_built["dpo_healthy"]
    margins, accuracies, losses = (series(out, k) for k in ("rewards/margins", "rewards/accuracies", "loss"))
    assert margins[0] == 0.0 and losses[0] == pytest.approx(trl_runs.LN2, abs=1e-4)  # LoRA B = 0: policy == ref
    assert all(m > 0 for m in margins[1:]) and margins[-1] > 0.3
    assert accuracies[-1] == 1.0 and accuracies.index(1.0) <= 3
    assert losses[-1] < trl_runs.LN2 - 0.15
    assert (out / "adapter_config.json").is_file()  # a LoRA run


@pytest.mark.parametrize("name", ["dpo_no_signal", "dpo_truncated_pairs"])
def test_dpo_without_signal_has_zero_margins_and_ln2_loss(trl_runs_built, name):
    out = trl_runs_built[name]
    assert all(abs(m) < 1e-6 for m in series(out, "rewards/margins"))
    assert all(lo == pytest.approx(trl_runs.LN2, abs=1e-5) for lo in series(out, "loss"))
    assert all(g < 1e-4 for g in series(out, "grad_norm"))
    assert series(out, "logps/chosen") == pytest.approx(series(out, "logps/rejected"), abs=1e-4)


def test_truncated_pairs_differ_only_past_max_length():
    """The planted cause is truncation, not identical data: the texts differ, but not within max_length."""
    tok = trl_runs.tokenizer()
    for row in trl_runs.truncated_pairs():
        assert row["chosen"] != row["rejected"]
        chosen, rejected = (tok.apply_chat_template(row["prompt"] + row[side], tokenize=True, return_dict=True)
                            ["input_ids"] for side in ("chosen", "rejected"))
        first_difference = next(i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b)
        assert first_difference >= trl_runs.TRUNCATED_MAX_LENGTH


# ----------------------------------------------------------------------------------------------------------- GRPO
def test_grpo_healthy_has_reward_variance_and_ending_completions(trl_runs_built):
    out = trl_runs_built["grpo_healthy"]
    assert all(s > 0 for s in series(out, "reward_std"))
    assert all(f < 1 for f in series(out, "frac_reward_zero_std"))
    clipped = series(out, "completions/clipped_ratio")
    assert max(clipped) < 1 and sum(clipped) / len(clipped) < 0.25
    assert all(g > 0 for g in series(out, "grad_norm"))
    assert "rewards/brevity/mean" in history(out)[0]
    assert (out / "adapter_config.json").is_file()  # a LoRA run


def test_grpo_zero_variance_never_moves(trl_runs_built):
    out = trl_runs_built["grpo_zero_variance"]
    assert all(f == 1.0 for f in series(out, "frac_reward_zero_std"))
    assert all(s == 0.0 for s in series(out, "reward_std"))
    assert all(r == 0.0 for r in series(out, "reward"))
    assert all(lo == 0.0 for lo in series(out, "loss"))
    assert all(g == 0.0 for g in series(out, "grad_norm"))
    assert max(series(out, "completions/clipped_ratio")) < 1  # the completions end: the reward is the cause


def test_grpo_clipped_runs_every_completion_to_the_limit(trl_runs_built):
    out = trl_runs_built["grpo_clipped"]
    assert all(c == 1.0 for c in series(out, "completions/clipped_ratio"))
    for key in ("completions/mean_length", "completions/min_length", "completions/max_length"):
        assert all(n == trl_runs.MAX_COMPLETION for n in series(out, key)), key
    assert any(s > 0 for s in series(out, "reward_std"))  # the reward still varies: clipping is the cause
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|endoftext|>"  # while the chats end with <|im_end|>


# ---------------------------------------------------------------------------------------------------- KTO, reward
def test_kto_healthy_separates_desirable_from_undesirable(trl_runs_built):
    out = trl_runs_built["kto_healthy"]
    margins = series(out, "rewards/margins")
    assert margins[0] == 0.0 and margins[-1] > 0.5
    assert series(out, "loss")[-1] < series(out, "loss")[0]


def test_reward_model_learns_the_preference(trl_runs_built):
    out = trl_runs_built["reward_healthy"]
    assert series(out, "accuracy")[-1] == 1.0
    assert series(out, "margin")[-1] > 0 and series(out, "loss")[-1] < series(out, "loss")[0]
    assert not math.isnan(series(out, "mean_reward")[-1])
