"""A config.json declaring bitsandbytes 4-bit over bf16 weights (a merged model saved with its 4-bit base's config):
transformers loads it without quantizing; the probes that need a forward or a LoRA say that cause, never a bare
AssertionError or PEFT's "compress_statistics"."""

import json
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.findings import Finding
from workbench.model.declared_quantization import DeclaredQuantizationNotApplied, unquantized_bitsandbytes_layers
from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.forward.scenarios import forward_scenarios_probe
from workbench.probes.peft.probes import peft_attribute_probe

BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_compute_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def declared_4bit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("declares-4bit")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=128, pad_token_id=0, tie_word_embeddings=False,
                                 dtype="bfloat16")).to(torch.bfloat16).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": BNB_4BIT}))
    return folder


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def assert_names_the_declaration(raised):
    finding = Finding.from_exception("forward.scenarios", raised.value)
    assert finding.verdict == "error" and finding.title == "The checkpoint declares bitsandbytes 4-bit over bfloat16 weights"
    assert "config.quantization" in finding.detail and "quantization_config" in finding.fix
    assert finding.evidence["layer_class"] == "Linear4bit" and finding.evidence["count"] == 14


def test_transformers_loads_it_unquantized_and_the_forward_probes_name_the_cause(declared_4bit):
    target = resolve_target(str(declared_4bit))
    prepared = prepare_model(target)
    assert unquantized_bitsandbytes_layers(prepared.model)  # what transformers itself made of it
    with pytest.raises(DeclaredQuantizationNotApplied) as raised:
        forward_scenarios_probe(prepared, target)
    assert_names_the_declaration(raised)


def test_the_wrapping_chain_names_the_cause_not_compress_statistics(declared_4bit):
    with pytest.raises(DeclaredQuantizationNotApplied) as raised:
        peft_attribute_probe(resolve_target(str(declared_4bit)))
    assert_names_the_declaration(raised)
