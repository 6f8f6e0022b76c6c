import torch

from workbench.model.loading import load_pretrained
from workbench.model.setups import prepare_model, qlora
from workbench.probes.dtype.islands import fp32_islands


def test_healthy_bf16_model_has_only_intentional_islands(demo):
    report = fp32_islands(load_pretrained(demo.qwen_stage1))
    assert report.compute_dtype == "bfloat16"
    assert report.suspicious == []
    assert all("rotary" in i.intentional for i in report.islands)  # inv_freq buffers: fp32 on purpose
    assert report.findings()[0].verdict == "info"


def test_planted_fp32_buffer_in_a_frozen_module_is_named_first(demo):
    model = load_pretrained(demo.qwen_stage1)
    for p in model.parameters():
        p.requires_grad_(False)
    model.lm_head.weight.requires_grad_(True)
    block = model.model.visual.blocks[0]
    block.register_buffer("std_bias", torch.zeros(8, dtype=torch.float32))  # the Gemma-4 shape of the leak
    model.model.language_model.norm.weight.data = model.model.language_model.norm.weight.data.float()
    report = fp32_islands(model)
    finding = report.findings()[0]
    assert finding.verdict == "warn"
    names = [i.name for i in report.suspicious]
    assert names[0] == "model.visual.blocks.0.std_bias"
    assert "model.language_model.norm.weight" in names
    assert report.suspicious[0].component == "vision" and report.suspicious[0].module_frozen


def test_qlora_preparation_upcasts_on_purpose_and_says_so(demo):
    from importlib.metadata import version

    model = qlora(str(demo.qwen_stage1), adapter=str(demo.qwen_stage2))
    report = fp32_islands(model)
    finding = report.findings()[0]
    # prepare_model_for_kbit_training leaves every non-quantized parameter fp32: consistent, intentional
    assert finding.verdict == "info" and report.suspicious == []
    assert "prepare_model_for_kbit_training" in finding.detail and f"peft {version('peft')}" in finding.detail
    # LoRA weights are fp32 by PEFT's design
    assert any("lora_" in i.name and "PEFT" in i.intentional for i in report.islands)


def test_legacy_trl_casting_mixes_fp32_norms_with_a_bf16_head_and_warns(demo):
    from workbench.model.setups import qlora_trl_legacy

    report = fp32_islands(qlora_trl_legacy(str(demo.qwen_stage1), adapter=str(demo.qwen_stage2)))
    finding = report.findings()[0]
    assert finding.verdict == "warn"
    language = [i.name for i in report.suspicious if i.component == "language"]
    assert language and all(name.endswith("norm.weight") for name in language)  # fp32 norms, before a bf16 head
    # fp32 biases of 4-bit layers are cast to the compute dtype by bitsandbytes itself: contained, not suspicious
    assert not any(i.name.endswith(".bias") for i in report.suspicious)
    assert any((i.intentional or "").startswith("contained: Linear4bit") for i in report.islands)
    assert "peft_module_casting_to_bf16" in finding.detail
    assert any("lm_head" in n or "embed_tokens" in n for n in finding.evidence["half_precision_parameters"])


def test_the_containment_trace_is_the_accepting_forwards_and_judges_as_one_of_its_own(tmp_path):
    """CodeGen's fp32 `embed_positions` (a table its attention computes with and casts back) is asked of a traced
    eval forward without autocast: the forward that accepted the diagnosis batch is that cell, traced as it ran, so
    the islands step runs no second one, and judges as a forward traced for it alone does."""
    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import architectures
    from workbench.model.batch import target_inputs
    from workbench.model.passes import counted_passes
    from workbench.model.target import resolve_target
    from workbench.probes.dtype.probes import fp32_island_probe

    folder = build_tiny_checkpoint(next(a for a in architectures() if a.model_type == "codegen"), tmp_path)
    target = resolve_target(str(folder))
    prepared = prepare_model(target)
    with counted_passes() as passes:
        report = fp32_island_probe(prepared, target)
    assert passes.forwards == 1  # the accepting forward, its trace read by the containment question
    inputs, _how = target_inputs(prepared.model, target)
    with counted_passes() as passes:  # another dict of the same tensors: no trace remembered for it, one of its own
        fresh = fp32_islands(prepared.model, inputs=dict(inputs))
    assert passes.forwards == 1
    assert [(i.name, i.intentional) for i in report.islands] == [(i.name, i.intentional) for i in fresh.islands]
    assert report.islands and all(i.intentional.startswith("contained: CodeGenAttention") for i in report.islands)
