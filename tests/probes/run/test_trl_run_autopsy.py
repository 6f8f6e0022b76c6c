"""Notebook 08 on real trl runs (trl_runs.py: DPOTrainer, GRPOTrainer, KTOTrainer, RewardTrainer on a tiny Llama):
each trainer recognised, each planted fault named by its own check with its fix, healthy runs quiet, and no SFT
cause named for an RL signal."""

from __future__ import annotations

import json
import shutil

import pytest
import trl_runs

import workbench as wb

pytestmark = pytest.mark.slow

STEPS = ("run_dir", "training_log", "run_signals", "adapter_progress", "versions")
SFT_CAUSES = ("-100", "labels", "reentrant", "ln(", "use_reentrant", "enable_input_require_grads")


def notebook_08(output_dir):
    """Every step of notebook 08 through the notebook contract (recorder, one answer per check)."""
    nb = wb.open_notebook("08_training_run", checkpoint=str(output_dir),  # the sidecar beside the run, in tmp
                          findings_path=str(output_dir.parent / "findings.08_training_run.json"))
    results = {step: nb.run(step) for step in STEPS}
    return results, {f.id: f for f in nb.recorder.findings}


def sft_causes_named(findings) -> list[str]:
    """The findings that name a cause (info, warn, fail) and name a supervised-training one."""
    return [f"{f.id}: {cause}" for f in findings.values() if f.verdict in ("info", "warn", "fail")
            for cause in SFT_CAUSES if cause in f.title + f.detail + f.fix]


@pytest.mark.parametrize("name, trainer", [("dpo_healthy", "DPO"), ("grpo_healthy", "GRPO"),
                                           ("kto_healthy", "KTO"), ("reward_healthy", "Reward")])
def test_healthy_trl_runs_are_recognised_and_stay_quiet(trl_runs_built, name, trainer):
    results, findings = notebook_08(trl_runs_built[name])
    kind = results["training_log"].facts.kind
    assert kind.name == trainer and "training_args.bin" in kind.evidence and "not unpickled" in kind.evidence
    loud = {i: (f.verdict, f.title) for i, f in findings.items() if f.verdict in ("warn", "fail", "error")}
    assert loud == {}
    own = {"DPO": "run.preference_signal", "GRPO": "run.reward_variance", "KTO": "run.preference_signal",
           "Reward": "run.reward_model"}[trainer]
    assert findings[own].verdict == "pass"
    assert "[figure:" in str(results["run_signals"])


def test_a_dpo_run_reaching_accuracy_one_in_a_few_steps_is_healthy(trl_runs_built):
    _, findings = notebook_08(trl_runs_built["dpo_healthy"])
    assert findings["run.preference_signal"].verdict == "pass"
    assert findings["run.likelihood_displacement"].verdict == "pass"
    assert findings["run.loss"].verdict == "pass" and "not a cross-entropy" in findings["run.loss"].detail


@pytest.mark.parametrize("name", ["dpo_no_signal", "dpo_truncated_pairs"])
def test_a_dpo_run_without_preference_signal_is_named_with_max_length(trl_runs_built, name):
    _, findings = notebook_08(trl_runs_built[name])
    signal = findings["run.preference_signal"]
    assert signal.verdict == "fail" and "ln 2" in signal.title and signal.evidence["loss_at_ln2"]
    length = trl_runs.TRUNCATED_MAX_LENGTH if name == "dpo_truncated_pairs" else signal.evidence["max_length"]
    assert f"max_length={length}" in signal.fix and "chosen == rejected" in signal.fix
    assert findings["run.loss"].verdict == "pass"  # a flat ln 2 loss is not sent to the learning rate
    assert not sft_causes_named(findings)


def test_a_grpo_run_whose_reward_never_varies_names_the_reward_function(trl_runs_built):
    _, findings = notebook_08(trl_runs_built["grpo_zero_variance"])
    variance = findings["run.reward_variance"]
    assert variance.verdict == "fail" and "frac_reward_zero_std 1.0" in variance.title
    assert "answer_tag" in variance.detail and "`answer_tag`" in variance.fix  # the user's own function
    assert variance.evidence["num_generations"] == 4
    assert findings["run.loss"].verdict == "pass"  # loss 0 and grad_norm 0: not "no label is supervised"
    assert findings["run.completion_clipping"].verdict in ("pass", "info")
    assert not sft_causes_named(findings)


def test_a_grpo_run_whose_completions_never_end_names_max_completion_length(trl_runs_built):
    _, findings = notebook_08(trl_runs_built["grpo_clipped"])
    clipped = findings["run.completion_clipping"]
    assert clipped.verdict == "fail" and "clipped_ratio 1.0" in clipped.title
    assert f"max_completion_length={trl_runs.MAX_COMPLETION}" in clipped.detail
    assert "mask_truncated_completions=True" in clipped.fix and "EOS" in clipped.fix
    assert findings["run.reward_variance"].verdict != "fail"  # the reward varies: clipping is the cause


def test_the_trainer_is_recognised_without_training_args_bin_from_the_card_then_the_keys(trl_runs_built, tmp_path):
    from workbench.probes.run.run_kind import run_kind
    from workbench.probes.run.trainer_state import read_training_log

    copy = shutil.copytree(trl_runs_built["grpo_healthy"], tmp_path / "run")
    for pickled in copy.rglob("training_args.bin"):
        pickled.unlink()
    keys = set(read_training_log(copy / "trainer_state.json").metrics)
    by_card = run_kind([copy], keys)
    assert by_card.name == "GRPO" and "README.md tags" in by_card.evidence and by_card.args == {}
    (copy / "README.md").write_text("# no card\n")
    by_keys = run_kind([copy], keys)
    assert by_keys.family == "online_rl" and by_keys.name == "GRPO or RLOO"  # the keys both log
    assert run_kind([copy], {"loss", "grad_norm"}).is_sft


def grpo_in_callback(folder, reward, *, callback=None, eos_mismatch=False, steps=4):
    """A real GRPOTrainer on the tiny base, with `callback` (a WorkbenchCallback) or none: its log history."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    with trl_runs._one_thread():
        base = trl_runs.base_model(folder / "base", eos="<|endoftext|>" if eos_mismatch else None)
        args = GRPOConfig(**trl_runs._common(folder / "run", per_device_train_batch_size=8, num_generations=4,
                                             max_completion_length=trl_runs.MAX_COMPLETION, max_steps=steps,
                                             save_steps=100))
        trainer = GRPOTrainer(model=str(base), reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(trl_runs._prompts(40)),
                              processing_class=AutoTokenizer.from_pretrained(base),
                              callbacks=[callback] if callback is not None else [])
        trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


def callback_findings(callback) -> dict:
    report = json.loads((callback.report_folder / "findings.json").read_text())
    return {f["id"]: f for f in report["findings"]}


def test_the_live_callback_in_a_grpo_trainer_scores_the_first_batch_and_names_the_reward_variance(tmp_path):
    """WorkbenchCallback inside a real GRPOTrainer: before the first step the trainer's own code generates and
    scores the first batch (train.rl_rollout names the function that scores everything alike); after the last,
    the autopsy judges the live log by the same checks (the trainer recognised from the live GRPOConfig)."""
    from workbench.integrations import WorkbenchCallback

    callback = WorkbenchCallback()
    grpo_in_callback(tmp_path, trl_runs.answer_tag, callback=callback)
    by_id = callback_findings(callback)
    assert {i: f["title"] for i, f in by_id.items() if f["verdict"] == "error"} == {}  # the pre-flight ran on GRPO
    rollout = by_id["train.rl_rollout"]
    assert rollout["verdict"] == "warn" and "`answer_tag` → 0" in rollout["title"] and "`answer_tag`" in rollout["fix"]
    assert by_id["run.reward_variance"]["verdict"] == "fail"
    assert "GRPOConfig" in by_id["run.reward_variance"]["evidence"]["recognised_by"]
    assert by_id["run.loss"]["verdict"] == "pass"


def test_the_first_batch_of_a_run_that_never_stops_and_of_a_healthy_one(tmp_path):
    from workbench.integrations import WorkbenchCallback

    clipped, healthy = WorkbenchCallback(), WorkbenchCallback()
    grpo_in_callback(tmp_path / "clipped", trl_runs.says_red, callback=clipped, eos_mismatch=True, steps=1)
    rollout = callback_findings(clipped)["train.rl_rollout"]
    assert rollout["verdict"] == "warn" and f"max_completion_length={trl_runs.MAX_COMPLETION}" in rollout["title"]
    grpo_in_callback(tmp_path / "healthy", trl_runs.brevity, callback=healthy, steps=1)
    assert callback_findings(healthy)["train.rl_rollout"]["verdict"] == "pass"


def test_scoring_the_first_batch_leaves_the_run_as_it_would_have_been(tmp_path):
    """The same GRPO run with and without the callback: the same log, step for step (the random streams, the
    trainer's metrics, its completions table and token count are put back after the pre-flight's batch)."""
    from workbench.integrations import WorkbenchCallback

    keys = ("loss", "grad_norm", "reward", "reward_std", "completions/mean_length", "num_tokens")
    plain = grpo_in_callback(tmp_path / "plain", trl_runs.brevity, steps=2)
    watched = grpo_in_callback(tmp_path / "watched", trl_runs.brevity, callback=WorkbenchCallback(), steps=2)
    assert [{k: e.get(k) for k in keys} for e in watched] == [{k: e.get(k) for k in keys} for e in plain]


def test_tensorboard_events_past_the_last_save_are_read(tmp_path):
    """A run killed after its last save: the TensorBoard events (report_to="tensorboard") hold steps the
    checkpoints' trainer_state.json do not; notebook 08 reads the longer log, with tensorboard's EventAccumulator."""
    with trl_runs._one_thread():
        out = trl_runs._grpo(tmp_path, trl_runs.answer_tag, peft=False, report_to=["tensorboard"])
    (out / "trainer_state.json").unlink()  # no save_state at the end
    shutil.rmtree(out / "checkpoint-10")  # killed between the saves of steps 5 and 10
    results, findings = notebook_08(out)
    log = results["training_log"].log
    assert log.entries == 10 and results["training_log"].facts.state_path.name.startswith("events.out.tfevents")
    assert findings["run.reward_variance"].verdict == "fail"
    assert "TensorBoard events" in str(results["training_log"])


# ------------------------------------------------- the rarer verdicts: real trl logs with one column planted
def planted(output_dir, tmp_path, edit=None, *, eval_rows=(), keep=None):
    """A copy of a real trl run whose trainer_state.json has `edit(step_index, entry)` applied to every train
    entry, `eval_rows` appended, and only its first `keep` train entries when given: the run's own files, trainer
    and keys, with one signal changed."""
    copy = shutil.copytree(output_dir, tmp_path / "run")
    for state_path in [copy / "trainer_state.json", *copy.glob("checkpoint-*/trainer_state.json")]:
        state = json.loads(state_path.read_text())
        train = [e for e in state["log_history"] if "loss" in e]
        for i, entry in enumerate(train):
            if edit is not None:
                edit(i, entry)
        if keep is not None:
            state.update(log_history=train[:keep], global_step=keep, max_steps=keep)
        state["log_history"] += [dict(row) for row in eval_rows]
        state_path.write_text(json.dumps(state))
    return copy


def signals_of(output_dir, kind=None):
    """Notebook 08's log and signals steps on a run, the trainer `kind` forced when given: {check: finding}."""
    import dataclasses

    from workbench.model.target import resolve_target
    from workbench.probes.run.log_probe import training_log_probe
    from workbench.probes.run.trl_signals import run_signals_probe

    target = resolve_target(str(output_dir))
    logged = training_log_probe(target.run.run_dir, target)
    if kind is not None:
        logged = dataclasses.replace(logged, facts=dataclasses.replace(logged.facts, kind=kind))
    return {f.id: f for f in logged.findings() + run_signals_probe(logged).findings()}


@pytest.mark.parametrize("share, verdict", [(0.6, "info"), (0.95, "warn")])
def test_many_groups_without_reward_variance(trl_runs_built, tmp_path, share, verdict):
    def edit(i, entry):
        entry["frac_reward_zero_std"] = share
    found = signals_of(planted(trl_runs_built["grpo_healthy"], tmp_path, edit))["run.reward_variance"]
    assert found.verdict == verdict and "num_generations=4" in found.detail
    assert "If the reward is 0/1, a mean of" in found.detail  # the chance level, said as the condition it is


@pytest.mark.parametrize("ratio, verdict", [(0.3, "warn"), (0.08, "info"), (0.95, "fail")])
def test_clipped_completions_by_share(trl_runs_built, tmp_path, ratio, verdict):
    def edit(i, entry):
        entry["completions/clipped_ratio"] = ratio
    found = signals_of(planted(trl_runs_built["grpo_healthy"], tmp_path, edit))["run.completion_clipping"]
    assert found.verdict == verdict
    assert "max_completion_length" in found.fix


def test_kl_exactly_zero_with_beta_and_varying_rewards_warns(trl_runs_built, tmp_path):
    def edit(i, entry):
        entry["kl"] = 0.0
    found = signals_of(planted(trl_runs_built["grpo_healthy"], tmp_path, edit))["run.policy_drift"]
    assert found.verdict == "warn" and "exactly 0" in found.title and "sync_ref_model" in found.fix


def test_kl_runaway_warns(trl_runs_built, tmp_path):
    def edit(i, entry):
        entry["kl"] = 0.01 * 3 ** i  # 0.01 → 197 nats per token
    found = signals_of(planted(trl_runs_built["grpo_healthy"], tmp_path, edit))["run.policy_drift"]
    assert found.verdict == "warn" and "runs away" in found.title and "beta" in found.fix


@pytest.mark.parametrize("reward_rises, verdict", [(False, "warn"), (True, "info")])
def test_entropy_collapse(trl_runs_built, tmp_path, reward_rises, verdict):
    def edit(i, entry):
        entry["entropy"] = 1.0 if i < 5 else 0.01
        entry["reward"] = (0.1 * i) if reward_rises else (0.8 if i == 2 else 0.5)  # stalled under its best
    found = signals_of(planted(trl_runs_built["grpo_healthy"], tmp_path, edit))["run.policy_drift"]
    assert found.verdict == verdict and "Entropy collapsed" in found.title and "entropy_coef" in found.fix


def test_beta_zero_is_named_as_the_cause_of_zero_margins(trl_runs_built):
    from workbench.probes.run.run_kind import RunKind

    beta_zero = RunKind("preference", ("dpo",), "planted", {"beta": 0.0}, "training_args.bin")
    found = signals_of(trl_runs_built["dpo_no_signal"], kind=beta_zero)["run.preference_signal"]
    assert found.verdict == "fail" and "beta is 0" in found.title and "`beta` > 0" in found.fix


@pytest.mark.parametrize("eval_falls, verdict", [(False, "info"), (True, "warn")])
def test_likelihood_displacement(trl_runs_built, tmp_path, eval_falls, verdict):
    def edit(i, entry):  # chosen falls to -1.0 (β 0.1: -10 nats), the margin grows to 0.5 (5 nats)
        entry["rewards/chosen"] = -0.1 * (i + 1)
        entry["rewards/margins"] = 0.05 * (i + 1)
    evals = [{"step": s, "eval_loss": 0.5, "eval_rewards/accuracies": a}  # a sustained drop: the last two
             for s, a in ((4, 0.9), (7, 0.7 if eval_falls else 0.92), (10, 0.7 if eval_falls else 0.95))]
    found = signals_of(planted(trl_runs_built["dpo_healthy"], tmp_path, edit, eval_rows=evals))
    displaced = found["run.likelihood_displacement"]
    assert displaced.verdict == verdict and "lost likelihood" in displaced.title
    assert '"sft"' in displaced.fix and "2410.08847" in displaced.detail


@pytest.mark.parametrize("shape, verdict", [("falls", "warn"), ("with_length", "info"), ("rises", "pass")])
def test_the_reward_trend(trl_runs_built, tmp_path, shape, verdict):
    def edit(i, entry):
        entry["reward"] = {"falls": 0.9 - 0.08 * i, "with_length": 0.1 + 0.08 * i, "rises": 0.1 + 0.08 * i}[shape]
        entry["completions/mean_length"] = 4 + (2 * i if shape == "with_length" else i % 2)
    found = signals_of(planted(trl_runs_built["grpo_healthy"], tmp_path, edit))["run.reward_trend"]
    assert found.verdict == verdict
    if shape == "with_length":
        assert "2310.03716" in found.detail and "get_soft_overlong_punishment" in found.fix


@pytest.mark.parametrize("train, held_out, verdict", [(0.5, 0.5, "fail"), (1.0, 0.6, "warn")])
def test_reward_model_at_chance_or_overfit(trl_runs_built, tmp_path, train, held_out, verdict):
    def edit(i, entry):
        entry["accuracy"] = train
    evals = [{"step": 10, "eval_loss": 0.6, "eval_accuracy": held_out}]
    found = signals_of(planted(trl_runs_built["reward_healthy"], tmp_path, edit, eval_rows=evals))["run.reward_model"]
    assert found.verdict == verdict


class RunsCode:
    """Unpickling this runs a shell command (what a hostile training_args.bin could hold)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


class PickledArgs:
    pass


def test_training_args_are_read_from_opcodes_without_running_them(tmp_path):
    """A pickle that would run code when unpickled: read as inert placeholders, nothing executed; credentials
    (hub_token) never kept."""
    import pickle

    from workbench.probes.run.pickled_args import read_pickled_args

    marker = tmp_path / "ran"
    args = PickledArgs()
    args.__dict__.update(beta=0.04, num_generations=4, hub_token="hf_secret", payload=RunsCode(f"touch {marker}"))
    path = tmp_path / "training_args.bin"
    path.write_bytes(pickle.dumps(args, protocol=2))
    read = read_pickled_args(path)
    assert not marker.exists()
    assert read.cls.endswith("PickledArgs") and read.fields == {"beta": 0.04, "num_generations": 4}


def test_an_older_longer_tensorboard_launch_into_the_same_folder_is_not_this_run(tmp_path):
    """Two launches into one output_dir: an old one that logged 40 steps, then this run's 10 (the old folder is
    neither resumed nor this run's); the newest launch is read, and only where it goes further than the state."""
    from torch.utils.tensorboard import SummaryWriter

    from workbench.probes.run.tensorboard_log import tensorboard_state

    run = tmp_path / "run"
    for folder, steps in (("runs/Jan01_00-00-00_old", 40), ("runs/Feb01_00-00-00_new", 10)):
        writer = SummaryWriter(str(run / folder), filename_suffix="")
        for step in range(1, steps + 1):
            writer.add_scalar("train/loss", 1.0 / step, step)
        writer.close()
    state, files = tensorboard_state(run)
    assert state["global_step"] == 10 and all("new" in str(p) for p in files)
    assert tensorboard_state(run, max_steps=5) is None  # events past the recorded max_steps: another run's


def test_one_or_two_logged_steps_are_too_short_to_fail(trl_runs_built, tmp_path):
    found = signals_of(planted(trl_runs_built["dpo_no_signal"], tmp_path, keep=2))
    assert found["run.preference_signal"].verdict == "skip"


@pytest.mark.parametrize("run, column, check, verdict, evidence, fix_has, never", [
    # margins 0 over pairs that differ (their log-probabilities do): the policy never left the reference
    ("dpo_healthy", "rewards/margins", "run.preference_signal", "fail", ("cause", "no update"), "is_trainable=True",
     "chosen == rejected"),
    # zero gradients of identical pairs: explained by the pairs, not by checkpointing
    ("dpo_no_signal", "grad_norm", "run.gradients", "warn", ("explained_by", "run.preference_signal"),
     "run.preference_signal", "reentrant"),
])
def test_the_cause_of_a_zero_told_apart(trl_runs_built, tmp_path, run, column, check, verdict, evidence, fix_has,
                                        never):
    def edit(i, entry):
        entry[column] = 0.0
    found = signals_of(planted(trl_runs_built[run], tmp_path, edit))[check]
    assert found.verdict == verdict and found.evidence[evidence[0]] == evidence[1]
    assert fix_has in found.fix and never not in found.detail + found.fix


def test_an_rloo_run_with_a_kl_penalty_is_not_judged_on_its_penalised_variance(trl_runs_built):
    from workbench.probes.run.run_kind import RunKind

    rloo = RunKind("online_rl", ("rloo",), "forced", {"beta": 0.05}, "training_args.bin")
    found = signals_of(trl_runs_built["grpo_healthy"], kind=rloo)
    assert found["run.reward_variance"].verdict == "skip" and "KL" in found["run.reward_variance"].title


def test_the_trainer_is_told_from_its_distinct_keys():
    from workbench.probes.run.run_kind import run_kind, trainers

    dpo, cpo, orpo = (set(trainers()[k].keys) for k in ("dpo", "cpo", "orpo"))
    assert run_kind([], dpo).name == "DPO"
    assert run_kind([], dpo | cpo).name == "CPO"  # CPO logs every DPO key and nll_loss
    assert run_kind([], orpo | cpo).name == "ORPO"  # ORPO logs nll_loss too
    assert run_kind([], {"rewards/chosen", "logps/chosen", "kl", "loss"}).name == "KTO"  # no undesirable window


def test_hostile_pickles_are_refused_without_crashing_the_process(tmp_path):
    import io
    import zipfile

    from workbench.probes.run.pickled_args import read_pickled_args

    deep = tmp_path / "deep.bin"  # a million nested tuples as a dict key: hashing it would overflow the C stack
    deep.write_bytes(b"\x80\x02}N" + b"\x85" * 1_000_000 + b"Ns.")
    assert read_pickled_args(deep) is None
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:  # 5 MiB of zeros: a bomb in small
        archive.writestr("archive/data.pkl", b"\0" * (5 << 20))
    bomb = tmp_path / "bomb.bin"
    bomb.write_bytes(buffer.getvalue())
    assert read_pickled_args(bomb) is None


def test_the_live_callback_in_a_dpo_trainer_runs_its_preflight_and_reads_the_margins(tmp_path):
    """WorkbenchCallback in a real DPOTrainer (LoRA): the pre-flight runs on the live policy without an error (the
    data path says its batches are pairs, not labelled sequences), the autopsy reads the margins."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from workbench.integrations import WorkbenchCallback

    callback = WorkbenchCallback()
    with trl_runs._one_thread():
        base = trl_runs.base_model(tmp_path / "base")
        args = DPOConfig(**trl_runs._common(tmp_path / "run", per_device_train_batch_size=4, max_steps=4,
                                            learning_rate=5e-3, max_length=64, save_steps=100))
        DPOTrainer(model=str(base), args=args, train_dataset=Dataset.from_list(trl_runs._pairs(16)),
                   processing_class=trl_runs.tokenizer(), peft_config=trl_runs._lora(),
                   callbacks=[callback]).train()
    by_id = callback_findings(callback)
    assert {i: f["title"] for i, f in by_id.items() if f["verdict"] == "error"} == {}
    assert by_id["data.labels"]["verdict"] == "skip" and "chosen and rejected pairs" in by_id["data.labels"]["detail"]
    assert by_id["grad.flow"]["verdict"] in ("pass", "info")  # the pre-flight's step on the live policy
    assert by_id["train.rl_rollout"]["verdict"] == "skip"
    assert by_id["train.reference_model"]["verdict"] == "info"  # a LoRA policy: its adapters disabled
    assert by_id["data.pairs"]["verdict"] == "pass"
    assert by_id["run.preference_signal"]["verdict"] == "pass"


def test_a_first_batch_whose_groups_mostly_agree_is_information():
    """A 0/1 reward that differs across the batch but agrees within most prompt groups (what the trainer's metrics
    say after scoring): named as information, not a warning — usual with few generations."""
    from workbench.probes.train.rl_rollout import RolloutResult

    result = RolloutResult("GRPOTrainer", {"frac_reward_zero_std": 0.75, "completions/clipped_ratio": 0.0,
                                           "completions/mean_length": 6.0}, {"correct": (0.4, 0.49)}, 32, 12)
    (found,) = result.findings()
    assert found.verdict == "info" and "75%" in found.title and "num_generations" in found.fix


@pytest.mark.parametrize("case, verdict", [("lora", "info"), ("full", "pass"), ("bf16_reference", "warn"),
                                           ("grpo_beta_zero", "info")])
def test_the_reference_model_against_the_policy(tmp_path, case, verdict):
    """A real DPOTrainer (or GRPOTrainer) as it stands before its first step, its reference read by the probe."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

    from workbench.probes.train.configuration import TrainingConfiguration
    from workbench.probes.train.reference_model import reference_model_probe

    with trl_runs._one_thread():
        base = trl_runs.base_model(tmp_path / "base")
        if case == "grpo_beta_zero":
            args = GRPOConfig(**trl_runs._common(tmp_path / "run", per_device_train_batch_size=8, num_generations=4,
                                                 max_completion_length=8, max_steps=1))
            trainer = GRPOTrainer(model=str(base), reward_funcs=trl_runs.brevity, args=args,
                                  train_dataset=Dataset.from_list(trl_runs._prompts(8)))
        else:
            args = DPOConfig(**trl_runs._common(tmp_path / "run", per_device_train_batch_size=4, max_steps=1,
                                                max_length=64))
            reference = (AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
                         if case == "bf16_reference" else None)
            trainer = DPOTrainer(model=str(base), ref_model=reference, args=args,
                                 train_dataset=Dataset.from_list(trl_runs._pairs(8)),
                                 processing_class=trl_runs.tokenizer(),
                                 peft_config=trl_runs._lora() if case == "lora" else None)
    (found,) = reference_model_probe(TrainingConfiguration("trainer", trainer.args, trainer)).findings()
    assert found.verdict == verdict
    if case == "bf16_reference":
        assert "bfloat16, the policy float32" in found.title and "dtype=torch.float32" in found.fix
    if case == "lora":
        assert "adapters disabled" in found.title


@pytest.mark.parametrize("rows", ["same", "truncated"])
def test_the_callback_names_the_pairs_a_dpo_run_cannot_separate_before_its_first_step(tmp_path, rows):
    """data.pairs in the live pre-flight: chosen == rejected rows, and rows that differ only past max_length=48,
    found through the DPOTrainer's own collator before any step, rows named; raise_on="fail" stops the run."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from workbench.integrations import WorkbenchCallback, WorkbenchStop

    pairs = trl_runs._pairs(16, same=True) if rows == "same" else trl_runs.truncated_pairs(16)
    callback = WorkbenchCallback(raise_on="fail")
    with trl_runs._one_thread():
        base = trl_runs.base_model(tmp_path / "base")
        args = DPOConfig(**trl_runs._common(tmp_path / "run", per_device_train_batch_size=4, max_steps=2,
                                            max_length=trl_runs.TRUNCATED_MAX_LENGTH, save_steps=100))
        trainer = DPOTrainer(model=str(base), args=args, train_dataset=Dataset.from_list(pairs),
                             processing_class=trl_runs.tokenizer(), peft_config=trl_runs._lora(), callbacks=[callback])
        with pytest.raises(WorkbenchStop, match="data.pairs FAIL"):
            trainer.train()
    pairs_found = callback_findings(callback)["data.pairs"]
    assert pairs_found["verdict"] == "fail" and pairs_found["title"].startswith("16 of 16 pairs")
    assert pairs_found["evidence"]["identical_rows"][:3] == [0, 1, 2]
    if rows == "truncated":  # the cause told apart: the rows differ, max_length made them equal
        assert len(pairs_found["evidence"]["made_equal_by_truncation"]) == 16
        assert pairs_found["fix"].startswith(f"Raise `max_length` (now {trl_runs.TRUNCATED_MAX_LENGTH})")
    else:
        assert pairs_found["evidence"]["made_equal_by_truncation"] == []
        assert pairs_found["fix"].startswith("drop the rows whose chosen equals rejected")


def test_a_few_identical_pairs_among_many_are_a_warning_naming_the_rows(tmp_path):
    import types

    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from workbench.probes.data.pairs import preference_pairs_probe

    pairs = trl_runs._pairs(150)
    pairs[37] = {**pairs[37], "rejected": pairs[37]["chosen"]}  # one copy-paste slip in 150 rows
    with trl_runs._one_thread():
        base = trl_runs.base_model(tmp_path / "base")
        args = DPOConfig(**trl_runs._common(tmp_path / "run", per_device_train_batch_size=4, max_steps=1,
                                            max_length=64))
        trainer = DPOTrainer(model=str(base), args=args, train_dataset=Dataset.from_list(pairs),
                             processing_class=trl_runs.tokenizer(), peft_config=trl_runs._lora())
    (found,) = preference_pairs_probe(None, types.SimpleNamespace(trainer=trainer)).findings()
    assert found.verdict == "warn" and found.evidence["identical_rows"] == [37]
