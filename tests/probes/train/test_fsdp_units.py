"""train.fsdp_units: torch's wrapping walk replayed on a meta copy. Planted: fp32 norms beside bf16 weights in one
FSDP1 unit, frozen and trainable tensors in one unit with use_orig_params=False, an fp32 norm beside bf16
weights in one FSDP2 group without mixed precision; their healthy twins pass. A 70B-shaped Llama
replays from the meta device."""

import time

import pytest
import torch

from workbench.model.setups import PreparedModel
from workbench.probes.train.configuration import TrainingConfiguration
from workbench.probes.train.fsdp_units import fsdp_units_probe


def tiny_llama(dtype=torch.bfloat16, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).to(dtype)


def configuration(tmp_path, fsdp_config=None, **fields) -> TrainingConfiguration:
    from transformers import TrainingArguments

    given = dict(fields, **({"fsdp": True, "fsdp_config": fsdp_config} if fsdp_config is not None else {}))
    return TrainingConfiguration("file training_args.yaml", TrainingArguments(str(tmp_path / "out"), report_to=[],
                                                                              **given), given=given)


FSDP1 = {"version": 1, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}


def verdict(result):
    (found,) = result.findings()
    return found


def test_fp32_norms_beside_bf16_weights_in_one_fsdp1_unit_fail(tmp_path):
    model = tiny_llama()
    for layer in model.model.layers:
        layer.input_layernorm.float()
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "fp32 norms"), None,
                                     configuration(tmp_path, FSDP1)))
    assert found.verdict == "fail", found
    assert "Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32" in found.title
    assert "model.layers.0" in found.title and "model.layers.0.input_layernorm.weight (torch.float32)" in found.detail
    assert "_flat_param.py" in found.detail
    assert found.evidence["unit_count"] == 3  # two decoder layers and the root


def test_uniform_bf16_full_fine_tune_under_fsdp1_passes(tmp_path):
    model = tiny_llama()
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "bf16"), None, configuration(tmp_path, FSDP1)))
    assert found.verdict == "pass", found
    assert [u["unit"] for u in found.evidence["units"]] == ["model.layers.0", "model.layers.1", "(root)"]
    assert all(p.device.type == "cpu" for p in model.parameters())  # the walk ran on a copy


@pytest.mark.parametrize("use_orig_params, expected", [(False, "fail"), (True, "pass")])
def test_frozen_and_trainable_in_one_unit_need_use_orig_params(tmp_path, use_orig_params, expected):
    model = tiny_llama()
    for layer in model.model.layers:
        layer.self_attn.requires_grad_(False)  # attention frozen, MLP and norms trained
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "partly frozen"), None,
                                     configuration(tmp_path, {**FSDP1, "use_orig_params": use_orig_params})))
    assert found.verdict == expected, found
    if expected == "fail":
        assert "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`" in found.title
        assert "use_orig_params': True" in found.fix


def test_lora_on_bf16_under_fsdp1_gets_peft_units_and_passes(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "lora"), None,
                                     configuration(tmp_path, {**FSDP1, "use_orig_params": False})))
    assert found.verdict == "pass", found  # PEFT's policy gives every trainable LoRA leaf a unit of its own
    assert "PEFT's fsdp_auto_wrap_policy" in found.evidence["policy"]
    assert any(u["unit"].endswith("lora_A.default") and u["dtypes"] == "float32" for u in found.evidence["units"])


@pytest.mark.parametrize("bf16, expected", [(False, "fail"), (True, "pass")])
def test_fsdp2_group_with_fp32_norms_beside_bf16_weights_needs_mixed_precision(tmp_path, bf16, expected):
    model = tiny_llama(layers=1)
    model.model.layers[0].post_attention_layernorm.float()
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "fp32 norm"), None,
                                     configuration(tmp_path, {"version": 2}, bf16=bf16, use_cpu=bf16)))
    assert found.verdict == expected, found
    if expected == "fail":
        assert "FSDP expects uniform original parameter dtype but got" in found.title
        assert "model.layers.0" in found.title and "_fsdp_param_group.py" in found.detail
    else:  # accelerate upcasts every trainable parameter to fp32 under mixed precision
        assert "model.layers.0.mlp.up_proj.weight" in found.evidence["upcast_fp32"]
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # the model itself is untouched


def test_without_fsdp_the_default_units_are_information(tmp_path):
    found = verdict(fsdp_units_probe(PreparedModel(tiny_llama(), None, "t", "bf16"), None, configuration(tmp_path)))
    assert found.verdict == "info" and "not configured" in found.title
    assert found.evidence["version"] == 2 and found.evidence["unit_count"] >= 3


def test_a_running_training_that_does_not_shard_replays_nothing(tmp_path, monkeypatch):
    import workbench.probes.train.fsdp_units as units
    from workbench.probes.train.configuration import RunLaunch

    monkeypatch.setattr(units, "fsdp2_plan", lambda *a: pytest.fail("replayed the units of a run that does not shard"))
    running = TrainingConfiguration("trainer", configuration(tmp_path).args, object(), launch=RunLaunch(2, "no", False))
    found = verdict(fsdp_units_probe(PreparedModel(tiny_llama(), None, "t", "bf16"), None, running))
    assert found.verdict == "info" and "not used by your Trainer" in found.title and "2 processes" in found.detail


def test_a_70b_shaped_llama_replays_on_the_meta_device(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    start = time.perf_counter()
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "70B"), None, configuration(tmp_path, FSDP1)))
    elapsed = time.perf_counter() - start
    assert found.verdict == "pass" and found.evidence["unit_count"] == 81, found
    print(f"70B-shaped FSDP1 replay: {elapsed:.2f} s (probe), {found.evidence['seconds']} s (walk)")


@pytest.mark.slow  # a real bitsandbytes 4-bit load
@pytest.mark.parametrize("storage", [None, torch.bfloat16])
def test_qlora_under_fsdp2_warns_when_the_quant_storage_is_not_the_compute_dtype(tmp_path, storage):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tiny_llama().save_pretrained(tmp_path / "llama")
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                               **({"bnb_4bit_quant_storage": storage} if storage is not None else {}))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "llama", quantization_config=quant, dtype=torch.bfloat16)
    model = get_peft_model(prepare_model_for_kbit_training(model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    found = verdict(fsdp_units_probe(PreparedModel(model, None, "t", "qlora"), None,
                                     configuration(tmp_path, {"version": 2}, bf16=True, use_cpu=True)))
    if storage is not None:  # the FSDP-QLoRA recipe: the 4-bit weights shard with the rest
        assert found.verdict == "pass" and not found.evidence["ignored_4bit"], found
        return
    assert found.verdict == "warn", found
    assert found.title == ("bnb_4bit_quant_storage=uint8 is not the compute dtype bfloat16: the 4-bit weights stay "
                           "out of FSDP2's shards")
    assert found.evidence["quant_storage"] == {"storage": "uint8", "compute": "bfloat16"}
    ignored = found.evidence["ignored_4bit"]
    assert "base_model.model.model.layers.0.self_attn.v_proj.base_layer.weight" in ignored
    assert not any("lora_" in name for name in ignored)  # the trained LoRA weights are sharded
    assert f"({len(ignored)} here)" in found.detail and "every rank holds all of them" in found.detail
    assert found.fix == "BitsAndBytesConfig(..., bnb_4bit_quant_storage=torch.bfloat16)"
