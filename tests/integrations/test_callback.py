"""WorkbenchCallback on the real Trainer and trl's SFTTrainer: a healthy run trains unchanged and gets a report; a
planted defect stops training before its first step under raise_on="fail"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tiny_runs import losses, saved_head_lora, sft_trainer_for, tiny_checkpoint, trainer_for, vlm_trainer_for
from transformers import TrainerCallback

from workbench.integrations import WorkbenchCallback, WorkbenchStop

PREFLIGHT = {"tokenizer.vocab", "tokenizer.special_tokens", "config.tied_embeddings", "config.generation",
             "data.labels", "data.eos", "data.truncation", "data.template", "dtype.fp32_islands", "grad.flow",
             "train.fp16", "train.ddp_checkpointing", "train.fsdp_units", "train.loss_accumulation"}
AUTOPSY = {"run.loss", "run.gradients", "run.schedule", "run.eval", "run.adapter_progress"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def report_of(callback) -> dict:
    return json.loads((callback.report_folder / "findings.json").read_text())


def verdicts(report) -> dict[str, str]:
    return {f["id"]: f["verdict"] for f in report["findings"]}


def trains_unchanged(make_trainer, output_dir) -> WorkbenchCallback:
    """Train once with a WorkbenchCallback(raise_on="fail") and once without; the losses must be equal, exactly, step
    by step, over the 3 steps. `make_trainer(output_dir, callbacks)` builds the run. Returns the callback."""
    callback = WorkbenchCallback(raise_on="fail")
    with_callback = make_trainer(output_dir / "with", [callback])
    with_callback.train()
    without = make_trainer(output_dir / "without", [])
    without.train()
    assert losses(with_callback) == losses(without) and len(losses(without)) == 3
    return callback


def test_a_healthy_run_trains_unchanged_and_gets_a_dated_report(checkpoint, tmp_path):
    callback = trains_unchanged(lambda out, callbacks: trainer_for(checkpoint, out, callbacks), tmp_path)

    folder = callback.report_folder
    assert folder.parent.parent == (tmp_path / "with" / "workbench").resolve()  # output_dir/workbench/DAY/TIME-name
    report = report_of(callback)
    found = verdicts(report)
    assert PREFLIGHT | AUTOPSY <= set(found), sorted(PREFLIGHT | AUTOPSY - set(found))
    assert not {v for v in found.values()} & {"fail", "error"}, {k: v for k, v in found.items()
                                                                if v in ("fail", "error")}
    assert found["grad.flow"] == "pass" and found["data.labels"] == "pass" and found["run.loss"] == "pass"
    assert found["train.loss_accumulation"] == "skip"  # opt-in: two short trainings of its own
    labels = next(f for f in report["findings"] if f["id"] == "data.labels")
    assert labels["evidence"]["built_by"] == "trainer"  # the Trainer's own dataloader and collator
    assert report["target"]["checkpoint"] == str(checkpoint.resolve()) and report["schema_version"] == 1
    assert {n["name"] for n in report["notebooks"]} == {"00_saved_files", "07_data_path", "01_dtype_distribution",
                                                      "04_forward_checks", "09_training_step", "08_training_run"}
    index = (folder / "index.html").read_text()
    assert "run.loss" in index and "grad.flow" in index
    assert (folder / "04_forward_checks.html").is_file() and (folder / "trainer_state.json").is_file()
    # every check of a notebook the callback runs is answered: the steps it does not run say why
    from workbench.catalog import notebook

    for name in ("01_dtype_distribution", "04_forward_checks", "09_training_step", "07_data_path", "08_training_run"):
        answered = {f["id"] for f in report["findings"] if f["notebook"] == name}
        assert answered == set(notebook(name).checks), name
    versions = next(f for f in report["findings"] if f["id"] == "run.versions")  # read from the saved files only
    assert versions["verdict"] == "skip" and f"workbench diagnose {(tmp_path / 'with').resolve()}" in versions["fix"]
    census = next(f for f in report["findings"] if f["id"] == "dtype.census")
    assert census["verdict"] == "skip" and "workbench diagnose" in census["detail"]
    listing = (tmp_path / "with" / "workbench" / "index.html").read_text()  # every report of this output_dir
    assert f'href="{folder.parent.name}/{folder.name}/index.html"' in listing
    assert "WorkbenchCallback reports of this output_dir" in listing  # not the diagnoses' "Diagnosis reports"


def test_every_label_masked_stops_training_before_its_first_step(checkpoint, tmp_path):
    callback = WorkbenchCallback(raise_on="fail")
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback], masked=True)
    with pytest.raises(WorkbenchStop) as stopped:
        trainer.train()
    assert trainer.state.global_step == 0 and losses(trainer) == []
    message = str(stopped.value)
    assert "data.labels FAIL" in message and str(callback.report_folder / "index.html") in message
    assert any(f.id == "data.labels" and f.verdict == "fail" for f in stopped.value.findings)
    found = verdicts(report_of(callback))
    assert found["data.labels"] == "fail"
    # a batch with nothing supervised has a NaN loss and says nothing about the model: the model checks use the
    # workbench's own batch, and the gradients reach every trainable tensor
    assert found["grad.flow"] == "pass"


def test_a_trainable_tensor_cut_from_the_loss_stops_training(checkpoint, tmp_path):
    callback = WorkbenchCallback(raise_on="fail")
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback])
    trainer.model.model.norm.register_forward_pre_hook(lambda _module, args: (args[0].detach(),))
    with pytest.raises(WorkbenchStop, match="grad.flow FAIL: 19 of 21 trainable tensors get no gradient"):
        trainer.train()
    assert trainer.state.global_step == 0
    report = report_of(callback)
    grad = next(f for f in report["findings"] if f["id"] == "grad.flow")
    assert "first_batch.safetensors" in grad["evidence"]["inputs"]  # your collator's first batch
    assert verdicts(report)["data.labels"] == "pass"  # the healthy twin of the masked run's data


def test_a_trainable_fp16_copy_under_fp16_stops_training_and_its_fp32_twin_trains(checkpoint, tmp_path):
    """train.fp16 judges two things (a trainable fp16 tensor, the headroom): its one answer is the worse, so the
    fp16 modules_to_save copy GradScaler refuses stops the run even where the headroom is fine."""
    callback = WorkbenchCallback(raise_on="fail")
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback], fp16=True, prepare=saved_head_lora)
    with pytest.raises(WorkbenchStop, match="train.fp16 FAIL"):
        trainer.train()
    assert trainer.state.global_step == 0
    [fp16] = [f for f in report_of(callback)["findings"] if f["id"] == "train.fp16"]  # answered once
    assert fp16["verdict"] == "fail" and "lm_head.modules_to_save.default.weight" in fp16["detail"]
    assert "Also (" in fp16["detail"] and fp16["evidence"]["also"]  # the headroom reading kept beside it
    twin = WorkbenchCallback(raise_on="fail")
    fixed = trainer_for(checkpoint, tmp_path / "twin", [twin], fp16=True, max_steps=1,
                        prepare=lambda model: saved_head_lora(model, half=False))
    fixed.train()
    assert fixed.state.global_step == 1 and verdicts(report_of(twin))["train.fp16"] == "pass"


def test_reentrant_checkpointing_in_one_process_trains_on_with_the_ddp_hazard_as_information(checkpoint, tmp_path):
    """The model that stops 2 torchrun ranks (test_callback_distributed) trains in one process: DDP wraps nothing
    here, so raise_on="fail" does not stop it; the finding says what torchrun would do. fp16 and FSDP, which this run
    does not use, cost no forward and no replay."""
    callback = WorkbenchCallback(raise_on="fail")
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback], reentrant=True)
    trainer.train()
    assert trainer.state.global_step == 3
    report = report_of(callback)
    ddp = next(f for f in report["findings"] if f["id"] == "train.ddp_checkpointing")
    assert ddp["verdict"] == "info" and "One process" in ddp["title"] and "torchrun" in ddp["detail"]
    assert ddp["evidence"]["use_reentrant"] is True and "1 process" in ddp["evidence"]["launch"]
    found = {f["id"]: f for f in report["findings"]}
    assert "not read" in found["train.fp16"]["title"] and "not used by your Trainer" in found["train.fsdp_units"]["title"]
    assert found["grad.flow"]["verdict"] == "pass"


def test_by_default_a_defect_is_reported_and_training_goes_on(checkpoint, tmp_path):
    callback = WorkbenchCallback()
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback], masked=True)
    trainer.train()
    assert trainer.state.global_step == 3
    found = verdicts(report_of(callback))
    assert found["data.labels"] == "fail" and "run.loss" in found  # the autopsy appended to the same report


class DiesAfterSave(TrainerCallback):
    """Raises in on_save at `step`, after the callbacks before it: a run killed once that checkpoint was written."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("killed after a save")


def test_a_run_that_dies_after_a_save_has_its_autopsy_up_to_that_save(checkpoint, tmp_path):
    callback = WorkbenchCallback()
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback, DiesAfterSave(2)], save_strategy="steps",
                          save_steps=1)
    with pytest.raises(RuntimeError, match="killed after a save"):
        trainer.train()
    found = verdicts(report_of(callback))
    assert AUTOPSY <= set(found) and found["run.loss"] != "error", found
    saved = json.loads((callback.report_folder / "trainer_state.json").read_text())
    assert saved["global_step"] == 2 and len([e for e in saved["log_history"] if "loss" in e]) == 2


def test_trl_sft_trainer_healthy_and_unchanged(checkpoint, tmp_path):
    callback = trains_unchanged(lambda out, callbacks: sft_trainer_for(checkpoint, out, callbacks), tmp_path)
    report = report_of(callback)
    found = verdicts(report)
    assert found["grad.flow"] == "pass" and found["data.labels"] in ("pass", "info"), found
    labels = next(f for f in report["findings"] if f["id"] == "data.labels")
    assert labels["evidence"]["built_by"] == "trainer" and "SFTTrainer" in labels["detail"]


def test_a_vlm_lora_on_images_trains_unchanged_and_its_checks_read_the_collators_batch(demo, tmp_path):
    from workbench.tasks.grounding import write_dataset

    data = write_dataset(tmp_path / "grounding", 16)
    callback = trains_unchanged(lambda out, callbacks: vlm_trainer_for(demo.qwen_base, data, out, callbacks), tmp_path)
    report = report_of(callback)
    found = verdicts(report)
    assert not {v for v in found.values()} & {"fail", "error"}, found
    assert found["grad.flow"] == "pass" and found["data.labels"] == "pass" and found["run.loss"] == "pass"
    grad = next(f for f in report["findings"] if f["id"] == "grad.flow")
    assert "first_batch.safetensors" in grad["evidence"]["inputs"]  # the collator's batch, images and all
    labels = next(f for f in report["findings"] if f["id"] == "data.labels")
    assert labels["evidence"]["built_by"] == "trainer"


def test_a_model_built_in_memory_skips_the_saved_files(checkpoint, tmp_path):
    from transformers import LlamaForCausalLM

    callback = WorkbenchCallback(raise_on="fail")
    trainer = trainer_for(checkpoint, tmp_path / "out", [callback], max_steps=1)
    in_memory = LlamaForCausalLM(trainer.model.config)
    in_memory.config._name_or_path = ""
    trainer.model = trainer.model_wrapped = in_memory
    trainer.create_optimizer()
    trainer.train()
    report = report_of(callback)
    found = verdicts(report)
    assert {found[c] for c in ("tokenizer.vocab", "adapter.weights", "config.generation")} == {"skip"}
    assert found["grad.flow"] == "pass" and report["target"]["checkpoint"] == "LlamaForCausalLM (in memory)"


def test_raise_on_takes_fail_warn_or_none():
    with pytest.raises(ValueError, match="raise_on"):
        WorkbenchCallback(raise_on="error")


def test_importing_the_integrations_imports_neither_torch_nor_transformers():
    code = ("import sys, workbench.integrations; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_fp32_norms_before_a_bf16_head_stop_training_with_the_cause_not_the_crash(checkpoint, tmp_path):
    """The classic QLoRA crash: norms kept in fp32 (as peft's prepare_model_for_kbit_training keeps them) in a bf16
    model, trained without autocast; the first step would raise "expected m1 and m2 to have the same dtype"."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def fp32_norms(trainer):
        trainer.model.to(torch.bfloat16)
        for module in trainer.model.modules():
            if isinstance(module, LlamaRMSNorm):
                module.float()
        return trainer

    with pytest.raises(RuntimeError, match="same dtype"):  # without the callback: the step's own error
        fp32_norms(trainer_for(checkpoint, tmp_path / "plain")).train()
    callback = WorkbenchCallback(raise_on="fail")
    trainer = fp32_norms(trainer_for(checkpoint, tmp_path / "out", [callback]))
    with pytest.raises(WorkbenchStop, match="forward.dtype_flow FAIL") as stopped:
        trainer.train()
    assert trainer.state.global_step == 0
    flow = next(f for f in stopped.value.findings if f.id == "forward.dtype_flow")
    assert "`model.layers.0.input_layernorm` (weight float32) outputs float32" in flow.title and "q_proj" in flow.title
    assert verdicts(report_of(callback))["dtype.fp32_islands"] == "warn"  # what made the forward matrix run
