import torch

from workbench.probes.dtype.islands import fp32_islands
from workbench.model.loading import load_pretrained
from workbench.model.setups import qlora


def test_healthy_bf16_model_has_only_intentional_islands(demo):
    report = fp32_islands(load_pretrained(demo.qwen_stage1))
    assert report.compute_dtype == "bfloat16"
    assert report.suspicious == []
    assert all("rotary" in i.intentional for i in report.islands)  # inv_freq buffers: fp32 on purpose
    assert report.finding().verdict == "info"


def test_planted_fp32_buffer_in_a_frozen_module_is_named_first(demo):
    model = load_pretrained(demo.qwen_stage1)
    for p in model.parameters():
        p.requires_grad_(False)
    model.lm_head.weight.requires_grad_(True)
    block = model.model.visual.blocks[0]
    block.register_buffer("std_bias", torch.zeros(8, dtype=torch.float32))  # the Gemma-4 shape of the leak
    model.model.language_model.norm.weight.data = model.model.language_model.norm.weight.data.float()
    report = fp32_islands(model)
    finding = report.finding()
    assert finding.verdict == "warn"
    names = [i.name for i in report.suspicious]
    assert names[0] == "model.visual.blocks.0.std_bias"
    assert "model.language_model.norm.weight" in names
    assert report.suspicious[0].component == "vision" and report.suspicious[0].module_frozen


def test_qlora_preparation_upcasts_and_is_explained(demo):
    model = qlora(str(demo.qwen_stage1), adapter=str(demo.qwen_stage2))
    report = fp32_islands(model)
    finding = report.finding()
    assert finding.verdict == "warn"
    assert "prepare_model_for_kbit_training" in finding.detail
    # LoRA weights are fp32 by PEFT's design and are not suspicious
    assert not any("lora_" in i.name for i in report.suspicious)
    assert any("lora_" in i.name and "PEFT" in i.intentional for i in report.islands)
