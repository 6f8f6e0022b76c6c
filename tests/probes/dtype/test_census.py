import pytest
import torch

from workbench.model.loading import auto_config, load_pretrained
from workbench.probes.dtype.census import census_differences, dtype_census, predicted_quantized_census
from workbench.probes.dtype.probes import QuantizedCensusResult


def test_loaded_census_counts_parameters_and_buffers(demo):
    model = load_pretrained(demo.qwen_stage1)
    census = dtype_census(model)
    params = census.dtypes_by_component("parameter")
    assert set(params) == {"vision", "language", "head"}
    assert all(set(d) == {"bfloat16"} for d in params.values())
    assert sum(params["vision"].values()) == sum(1 for n, _ in model.named_parameters() if ".visual." in n)
    # rotary inv_freq buffers are fp32 on purpose and must be counted
    assert census.dtypes_by_component("buffer")["language"].get("float32", 0) >= 1


@pytest.mark.parametrize("quant, packed", [("4bit", "uint8"), ("8bit", "int8")])
def test_prediction_on_meta_agrees_with_a_real_bitsandbytes_load(demo, quant, packed):
    predicted = predicted_quantized_census(auto_config(demo.qwen_stage1), quant)
    real = dtype_census(load_pretrained(demo.qwen_stage1, quant=quant), label=f"real {quant}")
    assert census_differences(predicted, real) == []
    vision = predicted.dtypes_by_component()["vision"]
    assert vision[packed] > 0 and vision["bfloat16"] > 0  # a 4-bit VLM's shape: vision bf16 + packed weights
    # the packed 4-bit weights hold two values per byte
    real_bytes = {(r["component"], r["dtype"]): r["bytes"] for r in real.rows if r["kind"] == "parameter"}
    pred_bytes = {(r["component"], r["dtype"]): r["bytes"] for r in predicted.rows if r["kind"] == "parameter"}
    assert pred_bytes == real_bytes


def test_prediction_notices_a_changed_model(demo):
    predicted = predicted_quantized_census(auto_config(demo.qwen_stage1), "4bit")
    real = dtype_census(load_pretrained(demo.qwen_stage1, quant="4bit"))
    for p in real.rows:
        if p["component"] == "head":
            p["dtype"] = "float32"  # planted disagreement
    differences = census_differences(predicted, real)
    assert differences and differences[0]["component"] == "head"
    finding = QuantizedCensusResult({"4bit": predicted}, {"4bit": real}).findings()[0]
    assert finding.verdict == "warn" and finding.evidence["differences"]["4bit"] == differences
    assert QuantizedCensusResult({"4bit": predicted}, {"4bit": predicted}).findings()[0].verdict == "pass"


def test_predicting_a_7b_sized_model_reads_no_weight():
    from transformers import Qwen2VLConfig

    config = Qwen2VLConfig(text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064),
                           vision_config=dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16))
    census = predicted_quantized_census(config, "4bit", dtype=torch.bfloat16)
    by = census.dtypes_by_component()
    # Qwen2-VL-7B's numbers under 4-bit: vision bf16 261 + uint8 130; language uint8 196 + bf16 141 (lm_head apart)
    assert by["vision"] == {"bfloat16": 261, "uint8": 130}
    assert by["language"]["uint8"] == 196
