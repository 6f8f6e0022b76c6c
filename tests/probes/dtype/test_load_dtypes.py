"""The quantized prediction gives every tensor the dtype from_pretrained gives it: the class's dtype plan
(`_keep_in_fp32_modules` in fp16 only, `_keep_in_fp32_modules_strict` in fp16 and bf16) and the dtype the class
builds a tensor in (XLNet's `torch.FloatTensor` parameters stay fp32 in a bf16 load)."""

import pytest
import torch

from workbench.model.dtypes import dtype_plan_matcher
from workbench.model.loading import auto_config, load_pretrained
from workbench.model.quantized_prediction import predicted_tensors
from workbench.probes.dtype.census import census_differences, dtype_census, predicted_quantized_census


def _wo_dtypes(named) -> set[torch.dtype]:
    return {dtype for name, dtype in named if name.endswith("DenseReluDense.wo.weight")}


@pytest.mark.parametrize("dtype, wo", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
def test_t5_keeps_wo_in_fp32_only_in_an_fp16_load_as_the_real_load_does(tmp_path, dtype, wo):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2,
                                                vocab_size=64, decoder_start_token_id=0))
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    folder = tmp_path
    config = auto_config(folder)
    _, predicted = predicted_tensors(config, "4bit", dtype)
    assert _wo_dtypes((t.name, t.dtype) for t in predicted) == {wo}  # never packed: the quantizer skips it
    real = load_pretrained(folder, quant="4bit", dtype=dtype)
    assert _wo_dtypes((n, p.dtype) for n, p in real.named_parameters()) == {wo}
    assert census_differences(predicted_quantized_census(config, "4bit", dtype), dtype_census(real)) == []


def test_the_dtype_plan_is_the_classes_own():
    from transformers import T5Config, T5ForConditionalGeneration

    from workbench.model.loading import meta_model

    config = T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, vocab_size=32,
                      architectures=["T5ForConditionalGeneration"])
    skeleton, _ = meta_model(config, torch.bfloat16)
    name = "encoder.block.0.layer.1.DenseReluDense.wo.weight"
    assert dtype_plan_matcher(skeleton, torch.bfloat16)(name) is None
    assert dtype_plan_matcher(skeleton, torch.float16)(name) == torch.float32
    assert dtype_plan_matcher(skeleton, torch.float16)("encoder.block.0.layer.1.DenseReluDense.wi.weight") is None
    # a strict declaration holds in bf16 too
    strict = type("StrictT5", (T5ForConditionalGeneration,), {"_keep_in_fp32_modules_strict": ["wi"]})
    strict_skeleton = strict(config)
    assert dtype_plan_matcher(strict_skeleton, torch.bfloat16)(
        "encoder.block.0.layer.1.DenseReluDense.wi.weight") == torch.float32


def test_parameters_the_class_builds_in_fp32_are_predicted_fp32_as_loaded(tmp_path):
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(vocab_size=64, d_model=32, n_layer=2, n_head=2, d_inner=64))
    model.to(torch.bfloat16).save_pretrained(tmp_path)  # saved in bf16, as fine-tuning checkpoints are
    config = auto_config(tmp_path)
    _, predicted = predicted_tensors(config, "4bit")
    by_name = {t.name: t.dtype for t in predicted}
    assert by_name["transformer.layer.0.rel_attn.q"] == torch.float32  # torch.FloatTensor in XLNet's __init__
    real = load_pretrained(tmp_path, quant="4bit")
    assert real.get_parameter("transformer.layer.0.rel_attn.q").dtype == torch.float32
    assert census_differences(predicted_quantized_census(config, "4bit"), dtype_census(real)) == []
