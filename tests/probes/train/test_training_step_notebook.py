"""Notebook 09 end to end, in process: the catalog's steps on the demo's Llama under set-ups returning a Trainer."""

from pathlib import Path

import pytest

from workbench.catalog import notebook
from workbench.model import shared
from workbench.notebook import open_notebook


def verdicts_of_notebook_09(checkpoint, setup, tmp_path, monkeypatch, **options):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    shared.reset()
    try:
        nb = open_notebook("09_training_step", checkpoint=str(checkpoint), setup=setup,
                           findings_path=str(tmp_path / "findings.json"), **options)
        for step in notebook("09_training_step").steps:
            nb.run(step.name)
        return {f.id: f.verdict for f in nb.recorder.findings}, nb
    finally:
        shared.reset()


@pytest.mark.slow
def test_a_classifier_under_accumulation_fails_and_a_causal_lm_passes(demo, tmp_path, monkeypatch):
    found, nb = verdicts_of_notebook_09(demo.llama, "trainer_setups:classifier_under_accumulation", tmp_path,
                                        monkeypatch)
    assert found["train.loss_accumulation"] == "fail"
    assert nb.results["configuration"].source == "trainer"
    healthy, _ = verdicts_of_notebook_09(demo.llama, "trainer_setups:causal_lm_under_accumulation", tmp_path,
                                         monkeypatch)
    assert healthy["train.loss_accumulation"] == "pass" and healthy["train.ddp_checkpointing"] == "pass"


@pytest.mark.slow
def test_peft_checkpointing_in_a_trainer_makes_ddp_raise(demo, tmp_path, monkeypatch):
    found, _ = verdicts_of_notebook_09(demo.llama, "trainer_setups:lora_with_peft_checkpointing", tmp_path,
                                       monkeypatch)
    assert found["train.ddp_checkpointing"] == "warn"  # a diagnosis does not know the process count: conditional


@pytest.mark.slow
def test_a_training_args_file_asking_reentrant_checkpointing_fails_and_its_static_graph_twin_passes(
        demo, tmp_path, monkeypatch):
    args = tmp_path / "args.yaml"
    args.write_text("gradient_checkpointing: true\ngradient_checkpointing_kwargs: {use_reentrant: true}\n")
    found, nb = verdicts_of_notebook_09(demo.llama, "qlora", tmp_path, monkeypatch, training_args=str(args))
    assert nb.results["configuration"].source == f"file {args}"
    # the Trainer's call replaces the set-up's non-reentrant one; how many processes the run has is not stated
    assert found["train.ddp_checkpointing"] == "warn"
    args.write_text(args.read_text() + "ddp_static_graph: true\n")
    healthy, _ = verdicts_of_notebook_09(demo.llama, "qlora", tmp_path, monkeypatch, training_args=str(args))
    assert healthy["train.ddp_checkpointing"] == "pass"


def test_a_set_up_that_does_not_apply_leaves_no_configuration_and_every_training_check_skips(family, tmp_path,
                                                                                               monkeypatch):
    # the sft set-up on a classifier: nothing is prepared, so there is no configuration to read and no model to
    # judge; every check of the notebook says skip with the set-up's reason, none says error
    found, nb = verdicts_of_notebook_09(family("bert_seq_cls"), "sft", tmp_path, monkeypatch)
    assert found == dict.fromkeys(notebook("09_training_step").checks, "skip"), found
    by_id = {f.id: f for f in nb.recorder.findings}
    for check in ("train.fp16", "train.ddp_checkpointing", "train.fsdp_units"):
        f = by_id[check]
        assert f.title == "The sft set-up does not apply to BertForSequenceClassification (sequence classification)"
        assert "trl's SFTTrainer" in f.detail and "--setup plain" in f.detail, (check, f.detail)
        assert f.evidence["depends_on"] == "prepared"
    assert "does not apply" in nb.results["configuration"].view().html()
