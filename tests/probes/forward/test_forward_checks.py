import torch

from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.forward.grad_flow import grad_flow_probe, normalize_name
from workbench.probes.forward.mixed_precision_buffers import mixed_precision_buffer_probe
from workbench.probes.forward.scenarios import forward_scenarios_probe


def verdicts(report):
    return {f.id: f for f in report.findings()}


def cell(report, variant, mode, context):
    return next(c for c in report.cells if (c.variant, c.mode, c.context) == (variant, mode, context))


def test_norms_fp32_with_bf16_head(demo):
    target = resolve_target(str(demo.qwen_base))
    prepared = prepare_model(target)
    prepared.model.model.language_model.norm.float()
    report = forward_scenarios_probe(prepared, target)
    assert not cell(report, "as prepared", "train", "no autocast").ok
    assert cell(report, "as prepared", "train", "autocast").ok
    assert not cell(report, "as prepared", "train", "replica thread under autocast").ok
    found = verdicts(report)
    assert found["forward.scenarios"].verdict == "fail"
    flow = found["forward.dtype_flow"]
    assert flow.verdict == "fail" and "model.language_model.norm" in flow.title and "lm_head" in flow.title
    assert "same dtype" in flow.fix and "autocast" in flow.fix


def test_frozen_block_with_an_fp32_buffer(demo):
    target = resolve_target(str(demo.qwen_base))
    prepared = prepare_model(target)
    norm = prepared.model.model.language_model.norm
    norm.register_buffer("std_bias", torch.zeros(norm.weight.shape[0], dtype=torch.float32))  # Gemma-4's shape
    original = norm.forward
    norm.forward = lambda hidden: original(hidden) - norm.std_bias
    buffers = verdicts(mixed_precision_buffer_probe(prepared, target))["forward.mixed_precision_buffers"]
    assert buffers.verdict == "fail" and "model.language_model.norm.std_bias" in buffers.title
    assert "buffers" in buffers.fix
    flow = verdicts(forward_scenarios_probe(prepared, target))["forward.dtype_flow"]
    assert flow.verdict == "fail" and "`model.language_model.norm`" in flow.title  # the first mismatch is named


def test_lora_under_reentrant_checkpointing_without_the_input_grad_hook(demo):
    from peft import LoraConfig, get_peft_model

    from workbench.model.loading import load_pretrained
    from workbench.model.setups import PreparedModel

    model = load_pretrained(demo.llama)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    # transformers 5.23 and PEFT both install the input-grad hook by now; older releases and hand-rolled loops
    # did not. Plant that: no hook on the input embeddings.
    embeddings = model.get_input_embeddings()
    for key, hook in list(embeddings._forward_hooks.items()):
        if hook.__name__.startswith("make_inputs_require_grad"):
            del embeddings._forward_hooks[key]
    prepared = PreparedModel(peft_model, None, "planted", "reentrant checkpointing, no input-grad hook")
    finding = verdicts(grad_flow_probe(prepared, resolve_target(str(demo.llama))))["grad.flow"]
    assert finding.verdict == "fail"
    assert "enable_input_require_grads" in finding.detail and "use_reentrant" in finding.fix


def test_healthy_model_and_healthy_lora_produce_no_fail(demo):
    for target in (resolve_target(str(demo.qwen_base)),
                   resolve_target(str(demo.qwen_stage2), quant="4bit", setup="qlora"),
                   resolve_target(str(demo.llama), setup="qlora")):
        prepared = prepare_model(target)
        findings = [*grad_flow_probe(prepared, target).findings(),
                    *mixed_precision_buffer_probe(prepared, target).findings(),
                    *forward_scenarios_probe(prepared, target).findings()]
        assert not [f for f in findings if f.verdict in ("fail", "error")], [(f.id, f.title) for f in findings]


def test_fresh_lora_first_step_zero_lora_a_is_normal(demo):
    target = resolve_target(str(demo.llama), setup="qlora")  # a fresh LoRA: lora_B starts at zero
    report = grad_flow_probe(prepare_model(target), target)
    zero_a = [r for r in report.rows if r.role == "lora_A" and r.status == "zero"]
    assert zero_a and all(r.expected for r in zero_a)
    finding = report.findings()[0]
    assert finding.verdict == "pass" and "lora_B is still zero" in finding.detail


def test_vlm_matrix_runs_on_image_and_text(demo):
    target = resolve_target(str(demo.qwen_stage2), quant="4bit", setup="qlora")
    report = forward_scenarios_probe(prepare_model(target), target)
    assert "image + text" in report.inputs_how
    assert {c.variant for c in report.cells} == {"as prepared", "base (adapters disabled)"}
    assert len(report.cells) == 12


def test_names_are_normalized_across_wrappers():
    assert normalize_name("module.base_model.model.model.layers.0.q_proj.lora_A.default.weight") == \
        "model.layers.0.q_proj.lora_A.default.weight"


def test_inputs_the_model_cannot_take_are_a_skip_with_the_parameter_to_use(demo, tmp_path):
    from safetensors.torch import save_file

    target = resolve_target(str(demo.llama))
    prepared = prepare_model(target)
    bad = tmp_path / "bad.safetensors"
    save_file({"not_an_argument": torch.zeros(1, 4, dtype=torch.long)}, str(bad))
    target.params["forward_inputs"] = str(bad)
    found = verdicts(forward_scenarios_probe(prepared, target))
    assert found["forward.scenarios"].verdict == "skip" and "forward_inputs" in found["forward.scenarios"].fix
    good = tmp_path / "good.safetensors"
    save_file({"input_ids": torch.tensor([[1, 2, 3, 4]])}, str(good))
    target.params["forward_inputs"] = str(good)
    report = forward_scenarios_probe(prepared, target)
    assert "good.safetensors" in report.inputs_how and verdicts(report)["forward.scenarios"].verdict == "pass"


def test_out_of_memory_is_an_error_that_says_so(demo):
    target = resolve_target(str(demo.llama))
    prepared = prepare_model(target)
    layer = prepared.model.model.layers[0]

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    layer.forward = exhausted
    found = verdicts(forward_scenarios_probe(prepared, target))
    assert found["forward.scenarios"].verdict == "error" and "out of memory" in found["forward.scenarios"].title
