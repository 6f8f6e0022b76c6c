"""Notebook 09's checks on set-ups that return a real Trainer: the fault planted, and its healthy twin."""

import dataclasses
import json
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, Trainer, TrainingArguments

from workbench.errors import UsageError
from workbench.model.setups import PreparedModel
from workbench.probes.train.configuration import RunLaunch, read_training_args_file, training_configuration_probe
from workbench.probes.train.ddp_checkpointing import ddp_checkpointing_probe
from workbench.probes.train.loss_accumulation import loss_accumulation_probe

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, pad_token_id=0, num_labels=3)


@dataclasses.dataclass
class NoFiles:
    """A target with nothing to read the configuration from but what the test gives it."""

    training_args: str | None = None
    run: object = None
    allow_pickle: bool = False


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def tiny(cls):
    torch.manual_seed(0)
    return cls(LlamaConfig(**TINY))


def set_up_returning_trainer(model, tmp_path, **fields) -> PreparedModel:
    """What prepare_model gives for a set-up that returns its Trainer."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **fields)
    trainer = Trainer(model=model, args=args)
    return PreparedModel(trainer.model, None, "test:trainer", "a set-up returning its Trainer", trainer)


def configuration_of(prepared, target=None):
    return training_configuration_probe(target or NoFiles(), prepared)


def test_sequence_classification_under_accumulation_is_inflated_by_k(tmp_path):
    prepared = set_up_returning_trainer(tiny(LlamaForSequenceClassification), tmp_path,
                                        per_device_train_batch_size=2, gradient_accumulation_steps=4)
    configuration = configuration_of(prepared)
    assert configuration.source == "trainer" and configuration.given["gradient_accumulation_steps"] == 4
    result = loss_accumulation_probe(prepared, configuration)
    (finding,) = result.findings()
    assert finding.verdict == "fail" and result.outcome == "inflated"
    assert result.loss_ratio == pytest.approx(4, rel=1e-3) and result.grad_ratio == pytest.approx(4, rel=1e-3)
    assert result.forward_takes_kwargs and result.forward_passes_kwargs_to_loss is False
    assert "accepts_loss_kwargs = False" in finding.fix and "#47688" in finding.fix
    assert finding.evidence["trainer"] == "Trainer"


def test_causal_lm_under_accumulation_logs_the_same_loss(tmp_path):
    prepared = set_up_returning_trainer(tiny(LlamaForCausalLM), tmp_path,
                                        per_device_train_batch_size=2, gradient_accumulation_steps=4)
    result = loss_accumulation_probe(prepared, configuration_of(prepared))
    assert [f.verdict for f in result.findings()] == ["pass"]
    assert result.loss_ratio == pytest.approx(1, abs=1e-4) and result.forward_passes_kwargs_to_loss is True


def test_the_fix_is_measured_on_a_tiny_twin_of_a_large_model(tmp_path, monkeypatch):
    import workbench.probes.train.loss_accumulation as accumulation

    monkeypatch.setattr(accumulation, "REAL_MODEL_MAX_ELEMENTS", 0)  # the user's model counts as large: a twin runs
    model = tiny(LlamaForSequenceClassification)
    model.accepts_loss_kwargs = False  # the fix, set before the Trainer is built
    prepared = set_up_returning_trainer(model, tmp_path, per_device_train_batch_size=2,
                                        gradient_accumulation_steps=4)
    result = loss_accumulation_probe(prepared, configuration_of(prepared))
    assert "tiny twin" in result.model_source
    assert [f.verdict for f in result.findings()] == ["pass"] and result.accepts_loss_kwargs is False


def test_a_causal_lm_that_declines_loss_kwargs_is_not_token_weighted(tmp_path):
    model = tiny(LlamaForCausalLM)
    model.accepts_loss_kwargs = False
    prepared = set_up_returning_trainer(model, tmp_path, per_device_train_batch_size=2,
                                        gradient_accumulation_steps=4)
    result = loss_accumulation_probe(prepared, configuration_of(prepared))
    assert result.outcome == "unweighted" and [f.verdict for f in result.findings()] == ["warn"]
    assert "compute_loss_func" in result.findings()[0].fix


def test_dropout_does_not_pass_for_a_difference_in_accumulation(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=32))
    assert model.config.resid_pdrop > 0
    prepared = set_up_returning_trainer(model, tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    result = loss_accumulation_probe(prepared, configuration_of(prepared))
    assert [f.verdict for f in result.findings()] == ["pass"] and "dropout off" in result.model_source
    assert model.transformer.h[0].attn.resid_dropout.p > 0  # the user's model is left as it was


def test_with_the_defaults_a_classifier_is_info_and_says_how_to_give_the_configuration():
    prepared = PreparedModel(tiny(LlamaForSequenceClassification), None, "plain", "no trainer")
    (finding,) = loss_accumulation_probe(prepared, configuration_of(prepared)).findings()
    assert finding.verdict == "info" and "×4" in finding.title and "--training-args" in finding.detail


def lora_with_checkpointing(kwargs):
    """A LoRA model whose checkpointing was enabled as peft's prepare_model_for_kbit_training enables it
    (peft 0.21.2 utils/other.py:254-258: gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs))."""
    from peft import LoraConfig, get_peft_model

    model = tiny(LlamaForCausalLM)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def test_reentrant_checkpointing_with_find_unused_parameters_fails_on_two_processes_and_warns_unstated(tmp_path):
    prepared = set_up_returning_trainer(lora_with_checkpointing({}), tmp_path)  # peft's {}: torch's reentrant default
    configuration = configuration_of(prepared)
    result = ddp_checkpointing_probe(prepared, configuration)
    (finding,) = result.findings()  # a diagnosis: how many processes the run launches is not known
    assert finding.verdict == "warn" and "mark a variable ready only once" in finding.title
    assert "Under DDP (≥ 2 processes)" in finding.title and "in one process nothing raises" in finding.detail
    launched = dataclasses.replace(configuration, launch=RunLaunch(2, "no", False))  # the callback under torchrun
    (finding,) = ddp_checkpointing_probe(prepared, launched).findings()
    assert finding.verdict == "fail" and "mark a variable ready only once" in finding.title
    assert "2 processes" in finding.detail
    assert result.checkpointing.use_reentrant is True and result.find_unused_parameters is True
    assert "not a PreTrainedModel" in result.find_unused_how and "accelerator" in result.find_unused_how
    assert finding.fix.index("use_reentrant") < finding.fix.index("ddp_static_graph") < finding.fix.index(
        "ddp_find_unused_parameters=False")


def test_non_reentrant_checkpointing_passes(tmp_path):
    prepared = set_up_returning_trainer(lora_with_checkpointing({"use_reentrant": False}), tmp_path)
    result = ddp_checkpointing_probe(prepared, configuration_of(prepared))
    assert [f.verdict for f in result.findings()] == ["pass"]
    assert result.checkpointing.use_reentrant is False and result.find_unused_parameters is True


def test_static_graph_from_a_training_args_file_passes(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("ddp_static_graph: true\nper_device_train_batch_size: 2\n")
    prepared = PreparedModel(lora_with_checkpointing({}), None, "plain", "no trainer")
    configuration = configuration_of(prepared, NoFiles(training_args=str(path)))
    assert configuration.source == f"file {path}" and configuration.trainer is None
    result = ddp_checkpointing_probe(prepared, configuration)
    assert result.static_graph and [f.verdict for f in result.findings()] == ["pass"]


def test_the_trainers_own_checkpointing_call_is_asked(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"gradient_checkpointing": True, "ddp_find_unused_parameters": True,
                                "gradient_checkpointing_kwargs": {"use_reentrant": True}}))
    prepared = PreparedModel(tiny(LlamaForCausalLM), None, "plain", "no trainer")
    result = ddp_checkpointing_probe(prepared, configuration_of(prepared, NoFiles(training_args=str(path))))
    assert [f.verdict for f in result.findings()] == ["warn"]  # the raising cell, process count not stated
    path.write_text(json.dumps({"gradient_checkpointing": True}))  # transformers' None: use_reentrant=False
    result = ddp_checkpointing_probe(prepared, configuration_of(prepared, NoFiles(training_args=str(path))))
    assert result.checkpointing.use_reentrant is False and [f.verdict for f in result.findings()] == ["pass"]


def test_without_a_configuration_the_defaults_are_used_and_said(tmp_path):
    prepared = PreparedModel(tiny(LlamaForCausalLM), None, "plain", "no trainer")
    configuration = configuration_of(prepared)
    assert configuration.source == "defaults" and "--training-args" in configuration.assumed[0]
    finding = ddp_checkpointing_probe(prepared, configuration).findings()[0]
    assert finding.verdict == "pass" and "defaults" in finding.detail


def test_unknown_fields_in_a_training_args_file_are_one_line_naming_them(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("per_device_train_batch_size: 2\nlearning_rat: 1e-4\ngradient_acumulation_steps: 4\n")
    with pytest.raises(UsageError) as raised:
        read_training_args_file(path)
    message = str(raised.value)
    assert "\n" not in message and "gradient_acumulation_steps, learning_rat" in message


def test_a_trl_config_file_takes_its_own_and_its_scripts_fields(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("config_class: SFTConfig\nmodel_name_or_path: m\ndataset_name: d\nmax_length: 512\n"
                    "gradient_accumulation_steps: 8\n")
    cls, fields = read_training_args_file(path)
    assert cls.__name__ == "SFTConfig" and fields == {"max_length": 512, "gradient_accumulation_steps": 8}
    prepared = PreparedModel(tiny(LlamaForCausalLM), None, "plain", "no trainer")
    configuration = configuration_of(prepared, NoFiles(training_args=str(path)))
    assert type(configuration.args).__name__ == "SFTConfig" and configuration.args.gradient_accumulation_steps == 8
