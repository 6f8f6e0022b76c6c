"""The family matrix: every dtype probe stays quiet on a healthy checkpoint of each family people fine-tune, and
planted defects are named on several of them. Tiny checkpoints (workbench.demo.families),
meta-device predictions and real bitsandbytes loads on CPU: well under a minute."""

import pytest
import torch

from workbench.demo.families import FAMILIES
from workbench.model.loading import auto_config, load_pretrained
from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.dtype.census import predicted_quantized_census
from workbench.probes.dtype.headers import checkpoint_probe
from workbench.probes.dtype.islands import fp32_islands
from workbench.probes.dtype.probes import (
    QuantizedCensusResult,
    _real_quantized_census,
    fp32_island_probe,
    loaded_census_probe,
    quantized_census_probe,
)

# what a maintainer of each family calls its parts (README: how components are found)
COMPONENTS = {
    "llama": {"language", "head"}, "mistral": {"language", "head"}, "mixtral": {"language", "head"},
    "qwen2_tied": {"language"}, "gemma3_text": {"language"}, "gpt2": {"language"},  # tied: the head is the embedding
    "t5": {"language", "encoder", "decoder"},  # language: the `shared` token embedding both stacks (and lm_head) use
    "bert_seq_cls": {"language", "head"}, "bert_token_cls": {"language", "head"}, "bert_encoder": {"language"},
    "llava": {"vision", "projector", "language", "head"}, "qwen2_vl": {"vision", "language", "head"},
    "gemma3_vlm": {"vision", "projector", "language"},
}
TIED = {"qwen2_tied": "lm_head.weight = model.embed_tokens.weight", "gpt2": "lm_head.weight = transformer.wte.weight",
        "gemma3_text": "lm_head.weight = model.embed_tokens.weight",
        "gemma3_vlm": "lm_head.weight = model.language_model.embed_tokens.weight",
        "t5": "decoder.embed_tokens.weight = encoder.embed_tokens.weight = lm_head.weight = shared.weight"}
# transformers' conversion mapping fuses Mixtral's saved per-expert weights into one tensor per layer on load
FUSED_ON_LOAD = {"mixtral"}


def test_every_family_is_in_the_matrix():
    assert set(COMPONENTS) == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_healthy_family_headers_census_and_islands_are_quiet(family, name):
    target = resolve_target(str(family(name)))
    static = checkpoint_probe(target)
    assert [f.verdict for f in static.findings()] == ["pass"]
    headers = static.censuses[0]
    prepared = prepare_model(target)
    loaded = loaded_census_probe(prepared, target, static)
    (census_finding,) = loaded.findings()
    assert census_finding.verdict == "pass"
    by_component = loaded.dtypes_by_component("parameter")
    assert set(by_component) == COMPONENTS[name]  # nothing left in "other"
    assert set(headers.dtypes_by_component()) == COMPONENTS[name]
    if name not in FUSED_ON_LOAD:  # a tied tensor is saved once and counted once
        assert headers.dtypes_by_component() == by_component
    if name in TIED:
        assert TIED[name] in loaded.tied_note() and TIED[name] in headers.tied_note()
        assert TIED[name] in census_finding.detail
    else:
        assert not loaded.tied and not headers.tied
    islands = fp32_island_probe(prepared, target).findings()[0]
    assert islands.verdict in ("pass", "info"), islands.title
    assert islands.verdict == "pass" or "on purpose" in islands.title


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_quantized_prediction_agrees_with_the_real_4bit_load(family, name):
    target = resolve_target(str(family(name)))
    predicted = predicted_quantized_census(auto_config(target.model_dir), "4bit")
    real = _real_quantized_census(target, "4bit", None)
    if isinstance(real, str):  # bitsandbytes refused this family here: the prediction stands alone
        pytest.skip(real)
    finding = QuantizedCensusResult({"4bit": predicted}, {"4bit": real}).findings()[0]
    assert finding.verdict == "pass", finding.evidence["differences"]
    assert predicted.tied == real.tied
    assert set(predicted.dtypes_by_component()) == COMPONENTS[name]


@pytest.mark.parametrize("name", ["qwen2_tied", "t5"])  # the probe itself, 4 and 8 bit: two suffice
def test_quantized_census_probe_passes_on_tied_families_in_4_and_8_bit(family, name):
    target = resolve_target(str(family(name)))
    result = quantized_census_probe(target, static=checkpoint_probe(target), compare=[])
    (finding,) = result.findings()
    assert finding.verdict == "pass", finding.evidence["differences"]
    assert TIED[name] in finding.detail
    assert all(TIED[name] in row for row in result.comparison["tied (counted once)"])


def _qlora_prepared(folder, name):
    """The qlora set-up; for the BERT models, its own steps with a LoRA of no task type (the built-in set-up's fresh
    LoRA is CAUSAL_LM, which needs prepare_inputs_for_generation; SEQ_CLS would make the classifier trainable, and
    bitsandbytes packed it in 4 bit: both are the heads' business, not the dtype probes')."""
    if FAMILIES[name].head in ("causal_lm", "image_text_to_text", "seq2seq_lm"):
        return prepare_model(resolve_target(str(folder), quant="4bit", setup="qlora")).model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(load_pretrained(folder, quant="4bit"), use_gradient_checkpointing=True)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"]))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_qlora_upcast_is_intentional_on_a_healthy_family(family, name):
    from importlib.metadata import version

    report = fp32_islands(_qlora_prepared(family(name), name))
    finding = report.findings()[0]
    assert finding.verdict == "info", finding.detail
    assert f"peft {version('peft')}'s prepare_model_for_kbit_training" in finding.detail
    assert finding.evidence["intentional_upcast_by"] == f"peft {version('peft')}: prepare_model_for_kbit_training"
    assert report.suspicious == []


def _fp32_norms(model) -> list[str]:
    """Plant the DataParallel-crash defect: every norm of the decoder's own norm class in fp32, the head left bf16."""
    norm_class = type(model.model.norm)
    names = []
    for module_name, module in model.named_modules():
        if isinstance(module, norm_class):
            module.to(torch.float32)
            names.append(f"{module_name}.weight")
    return names


@pytest.mark.parametrize("name", ["qwen2_tied", "mistral", "llama"])
def test_planted_fp32_norms_before_a_bf16_head_are_named(family, name):
    model = load_pretrained(family(name))
    planted = _fp32_norms(model)
    assert model.lm_head.weight.dtype == torch.bfloat16
    report = fp32_islands(model)
    assert report.findings()[0].verdict == "warn"
    assert sorted(i.name for i in report.suspicious) == sorted(planted)
    assert "norm" in report.findings()[0].title


def test_planted_fp32_norms_stay_quiet_on_gemma3_whose_norm_returns_the_input_dtype(family):
    model = load_pretrained(family("gemma3_text"))
    planted = _fp32_norms(model)
    report = fp32_islands(model)
    assert report.findings()[0].verdict == "info" and report.suspicious == []
    contained = [i for i in report.islands if (i.intentional or "").startswith("contained: Gemma3RMSNorm")]
    assert sorted(i.name for i in contained) == sorted(planted)


def test_gemma3_rotary_buffers_are_known_by_their_module_not_their_name(family):
    report = fp32_islands(load_pretrained(family("gemma3_text")))
    rotary = [i for i in report.islands if i.kind == "buffer"]
    assert any(i.name.endswith("sliding_attention_inv_freq") for i in rotary)
    assert all("Gemma3RotaryEmbedding" in i.intentional for i in rotary)
    assert report.findings()[0].verdict == "info"


def test_a_tied_tensor_saved_twice_is_counted_once(family, copy_of):
    from safetensors.torch import load_file, save_file

    folder = copy_of(family("qwen2_tied"))
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # as older savers wrote both
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    static = checkpoint_probe(resolve_target(str(folder)))
    census = static.censuses[0]
    assert census.dtypes_by_component() == {"language": {"bfloat16": 26}}
    assert census.saved_twice == ["lm_head.weight"] and "saved twice: lm_head.weight" in census.tied_note()
