"""train.loss_accumulation answers on healthy inputs whose model cannot train as prepared: an adapter loaded for
inference (the plain set-up), a frozen model, a model offloaded by its device map. Never `error`."""

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from workbench.model.setups import PreparedModel
from workbench.probes.train.configuration import training_configuration_probe
from workbench.probes.train.loss_accumulation import loss_accumulation_probe

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, pad_token_id=0)
PARTLY_ON_DISK = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "disk"}


class NoFiles:
    training_args = None
    run = None
    allow_pickle = False


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False)).save_pretrained(folder)
    return folder


def measured(model):
    prepared = PreparedModel(model, None, "plain", "as the plain set-up loads it")
    result = loss_accumulation_probe(prepared, training_configuration_probe(NoFiles(), prepared))
    return result, [f.verdict for f in result.findings()]


def test_an_adapter_loaded_for_inference_is_measured_with_its_adapter_trainable_on_the_copy(checkpoint, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    trained = get_peft_model(AutoModelForCausalLM.from_pretrained(checkpoint),
                             LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trained.save_pretrained(tmp_path / "adapter")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint), str(tmp_path / "adapter"))
    assert not any(p.requires_grad for p in model.parameters())  # plain: nothing trainable
    result, verdicts = measured(model)
    assert verdicts == ["pass"] and result.loss_ratio == pytest.approx(1, abs=1e-4)
    assert "adapter made trainable" in result.model_source and result.grad_norm_a > 0
    assert not any(p.requires_grad for p in model.parameters())  # the user's model is left as it was


def test_a_frozen_model_is_measured_on_a_trainable_copy(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint).requires_grad_(False)
    result, verdicts = measured(model)
    assert verdicts == ["pass"] and "every parameter made trainable" in result.model_source
    assert not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("device_map", [PARTLY_ON_DISK, {"": "disk"}], ids=["partly", "wholly"])
def test_an_offloaded_model_is_measured_on_its_tiny_twin(checkpoint, tmp_path, device_map):
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map=device_map, offload_folder=str(tmp_path))
    assert any(p.device.type == "meta" for p in model.parameters())
    result, verdicts = measured(model)
    assert verdicts == ["pass"], result.findings()[0].detail
    assert "tiny twin" in result.model_source and "offloaded" in result.model_source


def test_a_marian_whose_config_names_its_decoder_vocabulary_is_measured_on_its_tiny_twin(tmp_path):
    """Published Marian configs (Helsinki-NLP's opus-mt) state `decoder_vocab_size`, the size of the head and of the
    view the loss takes of the logits: the twin shrinks it with `vocab_size` ("shape '[-1, 300]' is invalid" before,
    on every QLoRA form of a held-out Marian)."""
    from transformers import MarianConfig, MarianMTModel

    from workbench.probes.train.loss_accumulation import tiny_twin

    config = MarianConfig(vocab_size=300, decoder_vocab_size=300, d_model=32, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                          decoder_ffn_dim=64, pad_token_id=0, decoder_start_token_id=0, max_position_embeddings=64)
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(tmp_path / "marian")
    twin = tiny_twin(MarianMTModel.from_pretrained(tmp_path / "marian"))
    assert twin.config.decoder_vocab_size == twin.config.vocab_size < 300
    model = MarianMTModel.from_pretrained(tmp_path / "marian", device_map={"": "disk"}, offload_folder=str(tmp_path))
    result, verdicts = measured(model)
    assert "error" not in verdicts and "tiny twin" in result.model_source, result.findings()[0].detail
