"""A dtype break made by a stock transformers class is named as the library's, with its source line; a break the
set-up made (an fp32 norm before a bf16 head) is never blamed on the library."""

import torch

from workbench.model.setups import PreparedModel, prepare_model
from workbench.model.target import resolve_target
from workbench.probes.forward.mixed_precision_buffers import mixed_precision_buffer_probe
from workbench.probes.forward.scenarios import forward_scenarios_probe


def verdicts(report):
    return {f.id: f for f in report.findings()}


def saved(model, folder):
    model.to(torch.bfloat16).save_pretrained(folder)
    return resolve_target(str(folder))


def test_mra_attention_returning_fp32_is_named_as_the_class(tmp_path):
    from transformers import MraConfig, MraForMaskedLM

    torch.manual_seed(0)
    target = saved(MraForMaskedLM(MraConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=64, max_position_embeddings=64)), tmp_path / "mra")
    prepared = prepare_model(target)
    found = verdicts(forward_scenarios_probe(prepared, target))
    scenarios, flow = found["forward.scenarios"], found["forward.dtype_flow"]
    assert scenarios.verdict == "fail" and "transformers' own MraSelfAttention" in scenarios.title
    assert "modeling_mra.py" in scenarios.detail and "not your checkpoint" in scenarios.fix
    assert flow.verdict == "fail" and flow.evidence["library_class"]["kind"] == "returns"
    buffers = verdicts(mixed_precision_buffer_probe(prepared, target))["forward.mixed_precision_buffers"]
    assert buffers.verdict == "warn" and "MraSelfAttention" in buffers.title and "not in a buffer" in buffers.title


def xlnet(tmp_path):
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    return saved(XLNetLMHeadModel(XLNetConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_inner=64)),
                 tmp_path / "xlnet")


def test_xlnet_parameters_built_in_fp32_are_named_as_the_class_and_cast_once_they_pass(tmp_path):
    target = xlnet(tmp_path)
    prepared = prepare_model(target)  # from_pretrained(dtype=bf16): torch.FloatTensor(...) parameters stay fp32
    found = verdicts(forward_scenarios_probe(prepared, target))
    assert found["forward.scenarios"].verdict == "fail"
    assert "XLNetRelativeAttention" in found["forward.scenarios"].title
    library = found["forward.dtype_flow"].evidence["library_class"]
    assert library["kind"] == "builds" and library["parameter_dtype"] == "float32"
    assert "__init__" in library["source"] and "model.to(torch.bfloat16)" in found["forward.dtype_flow"].fix
    prepared.model.to(torch.bfloat16)  # the fix: every scenario passes
    assert verdicts(forward_scenarios_probe(prepared, target))["forward.scenarios"].verdict == "pass"


def test_a_set_up_that_casts_a_library_module_to_fp32_is_not_blamed_on_the_library(tmp_path):
    target = xlnet(tmp_path)
    prepared = prepare_model(target)
    prepared.model.to(torch.bfloat16)
    prepared.model.transformer.layer[0].ff.layer_1.float()  # the user's set-up, not the class
    found = verdicts(forward_scenarios_probe(prepared, target))
    assert found["forward.scenarios"].verdict == "fail" and "library_class" not in found["forward.scenarios"].evidence
    assert "transformers'" not in found["forward.dtype_flow"].title


def test_declared_fp32_parameters_stay_uncast_in_the_fsdp_simulation(tmp_path):
    # Inkling2's router computes hidden.float() against mlp.gate.weight (_keep_in_fp32_modules_strict): the
    # simulation leaves it fp32, as its own FSDP unit would; cast, the class itself raises
    from transformers import AutoModelForCausalLM, Inkling2TextConfig

    from workbench.architectures.tiny_config import tiny_config
    from workbench.model.loading import load_pretrained

    torch.manual_seed(0)
    target = saved(AutoModelForCausalLM.from_config(tiny_config(Inkling2TextConfig)), tmp_path / "inkling2")
    prepared = PreparedModel(load_pretrained(tmp_path / "inkling2"), None, "plain", "")
    buffers = verdicts(mixed_precision_buffer_probe(prepared, target))["forward.mixed_precision_buffers"]
    assert buffers.verdict in ("pass", "info"), buffers
    assert any("mlp.gate.weight" in name for name in buffers.evidence["kept_fp32_parameters"])
