"""run.loss, run.gradients, run.schedule and run.eval on output directories the real Trainer wrote."""

import json
import math

import pytest
from planted_runs import CLASSIFIER_GA, NAN_STEP, OVERFIT_EVALS

from workbench.model.target import resolve_target
from workbench.probes.run.log_probe import training_log_probe
from workbench.probes.run.trainer_state import training_log

RUN_CHECKS = ("run.loss", "run.gradients", "run.schedule", "run.eval")


def judged(run_dir, **options):
    target = resolve_target(str(run_dir), **options)
    result = training_log_probe(target.run.run_dir, target)
    by_check = {c: [f for f in result.findings() if f.id == c] for c in RUN_CHECKS}
    return result, by_check


def worst(findings):
    order = ("fail", "warn", "info", "skip", "pass")
    return min((f.verdict for f in findings), key=order.index)


def test_a_healthy_run_that_learns_stays_quiet(planted_runs):
    result, by_check = judged(planted_runs.healthy)
    assert {c: worst(f) for c, f in by_check.items()} == dict.fromkeys(RUN_CHECKS, "pass")
    assert result.log.loss[-1] < 0.5 * result.log.loss[0]  # it learned
    keep = by_check["run.eval"][0]
    assert keep.title.startswith("Checkpoint to keep: checkpoint-30")
    assert "[figure: loss, grad_norm and learning rate against step]" in str(result)
    assert "data:image/png;base64" in result.view().html()


def test_a_nan_loss_logged_as_zero_fails_with_its_steps_and_the_nan_weights(planted_runs):
    result, by_check = judged(planted_runs.nan_at_step)
    hidden = by_check["run.loss"][0]
    assert hidden.verdict == "fail" and f"from step {NAN_STEP}" in hidden.title
    assert hidden.evidence["first_step"] == NAN_STEP and hidden.evidence["steps"][:2] == [NAN_STEP, NAN_STEP + 1]
    assert hidden.evidence["checkpoint_checked"] == "checkpoint-10" and hidden.evidence["non_finite_tensors"]
    assert hidden.evidence["train_loss"] < hidden.evidence["finite_windows_mean"]  # 0.0 windows averaged in
    assert "restart" in hidden.fix or "checkpoint" in hidden.fix
    assert worst(by_check["run.gradients"]) == "pass"  # the nan grad_norm rows are run.loss's
    assert any(m.label == "NaN logged as 0.0" for m in result.marks)


def test_every_label_masked_fails_and_gradients_skip(planted_runs):
    _, by_check = judged(planted_runs.masked_labels)
    assert [f.verdict for f in by_check["run.loss"]] == ["fail"]
    assert "no label is supervised" in by_check["run.loss"][0].title
    assert [f.verdict for f in by_check["run.gradients"]] == ["skip"]


def test_warmup_longer_than_the_run_warns(planted_runs):
    _, by_check = judged(planted_runs.warmup_past_end)
    warmup = by_check["run.schedule"][0]
    assert warmup.verdict == "warn" and "never left its warmup" in warmup.title and "max_steps (20)" in warmup.fix
    assert worst(by_check["run.loss"]) == "pass"


def test_a_classifier_under_gradient_accumulation_shows_the_inflation(planted_runs):
    _, by_check = judged(planted_runs.classifier_ga)
    inflated = by_check["run.loss"][0]
    assert inflated.verdict == "warn" and round(inflated.evidence["ratio"]) == CLASSIFIER_GA
    assert "#47688" in inflated.detail and inflated.evidence["classes"] == 2


def test_the_recorded_accumulation_makes_it_a_fail_only_when_pickles_are_allowed(planted_runs, monkeypatch):
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("training_args.bin unpickled without --allow-pickle")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "load", refuse)
        _, by_check = judged(planted_runs.classifier_ga)
    assert by_check["run.loss"][0].verdict == "warn"
    _, allowed = judged(planted_runs.classifier_ga, allow_pickle=True)
    assert allowed["run.loss"][0].verdict == "fail"
    assert allowed["run.loss"][0].evidence["gradient_accumulation_steps"] == CLASSIFIER_GA


def test_the_same_head_without_accumulation_stays_quiet(planted_runs):
    _, by_check = judged(planted_runs.classifier_plain)
    assert worst(by_check["run.loss"]) == "pass"


def test_eval_loss_far_below_train_warns_and_the_healthy_eval_does_not(planted_runs):
    _, by_check = judged(planted_runs.eval_leak)
    below = by_check["run.eval"][0]
    assert below.verdict == "warn" and "below the training loss" in below.title and below.evidence["steps"]


def test_no_evaluation_is_info(planted_runs):
    _, by_check = judged(planted_runs.no_final_save)
    assert [f.verdict for f in by_check["run.eval"]] == ["info"]


def test_no_trainable_tensor_on_the_loss_graph_fails(planted_runs):
    result, by_check = judged(planted_runs.no_gradient)
    [none] = by_check["run.gradients"]
    assert none.verdict == "fail" and "nothing trainable gets a gradient" in none.title
    assert none.evidence["steps"] == result.log.step.tolist() and min(result.log.loss) > 3.0  # never learned
    assert "grad.flow" in none.fix


def test_eval_rising_while_training_falls_warns(planted_runs):
    result, by_check = judged(planted_runs.overfit)
    evals = result.log.eval_step.tolist()
    assert len(evals) == OVERFIT_EVALS and result.log.loss[-1] < 0.1 * result.log.loss[0]  # learned by heart
    [rising] = [f for f in by_check["run.eval"] if f.verdict == "warn"]
    assert "overfitting" in rising.title and rising.evidence["steps"] == evals[-4:]
    assert "EarlyStoppingCallback" in rising.fix
    assert any(m.series == "eval_loss" and m.label == "rising" for m in result.marks)


def test_a_learning_rate_of_zero_fails(planted_runs):
    _, by_check = judged(planted_runs.lr_zero)
    assert by_check["run.schedule"][0].verdict == "fail"
    assert "Learning rate 0 at every logged step (6 steps)" == by_check["run.schedule"][0].title


def test_a_flat_rate_under_a_recorded_decaying_scheduler_warns(planted_runs):
    """Trainer(optimizers=(AdamW, constant LambdaLR)) with lr_scheduler_type left at 'linear': the model card the
    Trainer writes names 'linear', the log is flat. Without the card nothing says which scheduler was meant."""
    _, by_check = judged(planted_runs.constant_scheduler)
    [flat] = [f for f in by_check["run.schedule"] if f.verdict == "warn"]
    assert "lr_scheduler_type is 'linear'" in flat.title and flat.evidence["flat_from_step"] == 1
    assert "README.md" in flat.detail and "optimizers=(optimizer, None)" in flat.fix
    card = planted_runs.constant_scheduler / "README.md"
    text = card.read_text()
    try:
        card.unlink()
        _, unknown = judged(planted_runs.constant_scheduler)
    finally:
        card.write_text(text)
    assert worst(unknown["run.schedule"]) in ("pass", "info")


def test_reduce_on_plateau_keeps_a_constant_rate_while_eval_improves_and_stays_quiet(planted_runs):
    result, by_check = judged(planted_runs.plateau_scheduler)
    assert result.facts.configuration.get("lr_scheduler_type") == "reduce_lr_on_plateau"
    assert len(set(result.log.learning_rate.tolist())) == 1 and worst(by_check["run.schedule"]) == "pass"


def _overflowed(run):
    state = json.loads((run / "trainer_state.json").read_text())
    return [e["step"] for e in state["log_history"]
            if "grad_norm" in e and not math.isfinite(e["grad_norm"]) and math.isfinite(e["loss"])]


def test_fp16_skipped_steps_with_the_default_fused_optimizer_advance_the_schedule(planted_runs):
    """A real GradScaler in the real Trainer: accelerate builds none on the CPU (fp16=True there trains in fp32), so
    the plant gives the Trainer's Accelerator what accelerate builds on a GPU, with torch's CPU GradScaler."""
    overflowed = _overflowed(planted_runs.fp16_skips)
    assert len(overflowed) >= 3 and overflowed[-1] > 2  # sporadic, past the scaler's calibration
    _, by_check = judged(planted_runs.fp16_skips)
    [skips] = by_check["run.gradients"]
    assert skips.verdict == "warn" and skips.evidence["steps"] == overflowed
    assert skips.evidence["lr_advanced_after"] == overflowed and skips.evidence["lr_held_after"] == []
    assert skips.evidence["optim"] == "adamw_torch_fused" and skips.evidence["fp16"] is True
    assert "accelerate #4242" in skips.detail and "optim='adamw_torch'" in skips.fix


def test_fp16_skipped_steps_with_an_unfused_optimizer_hold_the_schedule(planted_runs):
    overflowed = _overflowed(planted_runs.fp16_skips_unfused)
    _, by_check = judged(planted_runs.fp16_skips_unfused)
    [skips] = by_check["run.gradients"]
    assert skips.verdict == "warn" and skips.evidence["lr_held_after"] == overflowed and len(overflowed) >= 3
    assert skips.evidence["lr_advanced_after"] == [] and "#4242" not in skips.detail + skips.fix


def test_the_reader_touches_each_entry_a_fixed_number_of_times(planted_runs):
    """Linear in the entries: the accesses per entry do not grow with the log (no per-entry rescans)."""
    state = json.loads((planted_runs.healthy / "trainer_state.json").read_text())
    entries = [e for e in state["log_history"] if "loss" in e or "eval_loss" in e]

    class Counting(dict):
        touched = 0

        def __contains__(self, key):
            Counting.touched += 1
            return super().__contains__(key)

        def get(self, key, default=None):
            Counting.touched += 1
            return super().get(key, default)

        def __getitem__(self, key):
            Counting.touched += 1
            return super().__getitem__(key)

    def touches(n):
        Counting.touched = 0
        history = [Counting(entries[i % len(entries)]) for i in range(n)]
        log = training_log({**state, "log_history": history})
        assert log.entries + len(log.eval_step) == n
        return Counting.touched

    one, two, four = (touches(k * len(entries)) for k in (10, 20, 40))
    assert four - one == 3 * (two - one)  # a fixed cost per entry, plus a constant


@pytest.mark.parametrize("run", ["healthy", "nan_at_step", "masked_labels", "warmup_past_end", "classifier_ga",
                                 "eval_leak", "no_final_save", "classifier_plain", "no_gradient", "overfit",
                                 "lr_zero", "constant_scheduler", "plateau_scheduler", "fp16_skips",
                                 "fp16_skips_unfused"])
def test_every_finding_names_its_evidence_file(planted_runs, run):
    result, _ = judged(getattr(planted_runs, run))
    for finding in result.findings():
        assert finding.evidence.get("trainer_state", "").endswith("trainer_state.json"), finding
        assert finding.verdict in ("pass", "info", "skip") or finding.fix, finding
