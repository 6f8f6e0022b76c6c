"""grad.flow on a model offloaded by its device map: the offloaded tensors are named, not judged (their gradient lands
on accelerate's temporary copy), the rest judged; every tensor offloaded is a skip. Never a false `fail`."""

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from workbench.model.setups import PreparedModel
from workbench.model.target import resolve_target
from workbench.probes.forward.grad_flow import grad_flow_probe

PARTLY_ON_DISK = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=128, pad_token_id=0,
                                 tie_word_embeddings=False)).save_pretrained(folder)
    return folder


def finding_on(checkpoint, tmp_path, device_map):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map=device_map, offload_folder=str(tmp_path))
    prepared = PreparedModel(model, None, "plain", "loaded with a device map that offloads")
    (finding,) = grad_flow_probe(prepared, resolve_target(str(checkpoint))).findings()
    return finding


def test_partly_offloaded_the_rest_is_judged_and_the_offloaded_named(checkpoint, tmp_path):
    finding = finding_on(checkpoint, tmp_path, PARTLY_ON_DISK)
    assert finding.verdict == "info", finding.detail
    assert "not offloaded receive a gradient" in finding.title and "Not judged" in finding.detail
    assert "lm_head.weight" in finding.evidence["offloaded_not_judged"]
    assert finding.evidence["offloaded_count"] == 10 and finding.evidence["missing"] == []
    assert "model.layers.0.self_attn.q_proj.weight" not in finding.evidence["never_run"]


def test_wholly_offloaded_is_a_skip_naming_the_offload(checkpoint, tmp_path):
    finding = finding_on(checkpoint, tmp_path, {"": "disk"})
    assert finding.verdict == "skip" and "offloaded" in finding.title
    assert "temporary copy" in finding.detail and "--max-memory" in finding.fix
