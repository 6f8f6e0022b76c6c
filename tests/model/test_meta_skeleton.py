"""The meta-device skeleton (`loading.meta_model`) draws no initial values, and is the skeleton it was when it drew
them: every parameter's name, shape, dtype and requires_grad, every buffer's value, every tie, every module."""

import contextlib

import pytest
import torch
from transformers import PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import workbench.model.loading as loading
from workbench.architectures.tiny_config import tiny_config

# a decoder, a VLM (M-RoPE buffers), an encoder-decoder, an encoder, and Gemma (its RMSNorm weights start at 0)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2_vl": "Qwen2VLForConditionalGeneration",
                 "t5": "T5ForConditionalGeneration", "bert": "BertForSequenceClassification",
                 "gemma": "GemmaForCausalLM"}


def _tiny(model_type: str):
    config = tiny_config(CONFIG_MAPPING[model_type])
    config.architectures = [ARCHITECTURES[model_type]]
    return config


def _described(model: torch.nn.Module) -> dict:
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    return {"parameters": {n: (tuple(p.shape), p.dtype, p.device.type, p.requires_grad, type(p).__name__)
                           for n, p in model.named_parameters(remove_duplicate=False)},
            "buffers": {n: (b.dtype, b.device.type, b.tolist() if b.device.type != "meta" else tuple(b.shape))
                        for n, b in model.named_buffers(remove_duplicate=False)},
            "ties": sorted(names for names in owners.values() if len(names) > 1),
            "modules": [(n, type(m).__name__) for n, m in model.named_modules()]}


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
@pytest.mark.parametrize("quant", ["none", "4bit"])
def test_a_skeleton_draws_no_initial_values_and_is_the_one_that_drew_them(model_type, quant, monkeypatch):
    config = _tiny(model_type)

    def built() -> dict:
        quantization = loading.bnb_config(quant, model_class=loading.model_class_for(config))
        return _described(loading.meta_model(config, None, quantization)[0])

    drawn: list[str] = []
    own = PreTrainedModel._initialize_weights

    def counted(self, module, *args, **kwargs):
        drawn.append(type(module).__name__)
        return own(self, module, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", counted)
    skeleton = built()
    assert drawn == []
    monkeypatch.setattr(loading, "_values_not_drawn", contextlib.nullcontext)
    with_values_drawn = built()
    assert drawn, "the comparison must be against a skeleton that drew its values"
    assert skeleton == with_values_drawn


def test_the_library_class_is_itself_again_after_a_skeleton_and_after_one_that_raises():
    own = PreTrainedModel.__dict__["initialize_weights"]
    loading.meta_model(_tiny("llama"))
    assert PreTrainedModel.__dict__["initialize_weights"] is own
    config = _tiny("llama")
    config.head_dim = None  # the rotary embedding's size: the class raises a TypeError as it builds
    with pytest.raises(TypeError):
        loading.meta_model(config)
    assert PreTrainedModel.__dict__["initialize_weights"] is own
