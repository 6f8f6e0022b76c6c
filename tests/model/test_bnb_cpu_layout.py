"""bitsandbytes' CPU inference repack of 4-bit weights: never while the diagnosis shares a model, named when a
set-up hands one over packed. On a CPU without AVX-512 bf16 bitsandbytes never repacks by itself, so the tests force
the path the way such a CPU takes it: the layer's own flag (set from `has_avx512bf16()` when the layer is built), or
bitsandbytes' own packing function."""

import pytest
import torch

from workbench.model.bnb_cpu_layout import (
    HELD_MARK,
    REPACK_FLAG,
    held_layout_note,
    keep_training_layout,
    packed_for_cpu_inference,
    unpack_cpu_inference,
)

pytestmark = pytest.mark.slow  # real 4-bit loads and training steps


def _pack_like_an_eval_forward(model):
    """What Linear4bit.forward does on an AVX-512 bf16 CPU in eval mode without grad, with bitsandbytes' function."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None and hasattr(module, REPACK_FLAG):
            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu(module.weight.data, state)


def evaluated_then_trained(checkpoint, **options):
    """A user's set-up: the QLoRA recipe, then an evaluation pass on a CPU that repacks (`--setup` target)."""
    from workbench.model.setups import qlora

    model = qlora(checkpoint, **options)
    _pack_like_an_eval_forward(model)
    return model


def _layer(forced: bool):
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.nn.Linear(64, 64, bias=False).weight.data.clone(), requires_grad=False,
                                     quant_type="nf4").to("cpu")
    setattr(layer, REPACK_FLAG, forced)
    return torch.nn.Sequential(layer)


def test_the_training_layout_is_restored_and_kept():
    model = _layer(forced=True)
    reference = model[0].weight.data.clone()
    _pack_like_an_eval_forward(model)
    assert packed_for_cpu_inference(model) == ["0"]  # the premise: bitsandbytes' own packing marks the layout
    assert keep_training_layout(model) == 1
    assert packed_for_cpu_inference(model) == [] and torch.equal(model[0].weight.data, reference)
    assert getattr(model[0], REPACK_FLAG) is False and getattr(model[0], HELD_MARK) is True
    model.eval()
    with torch.no_grad():
        model(torch.randn(1, 5, 64, dtype=torch.bfloat16))
    assert packed_for_cpu_inference(model) == []  # the eval forward did not repack
    model.train()
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16, requires_grad=True)
    model(x).float().sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
    assert keep_training_layout(model) == 1 and unpack_cpu_inference(model) == 0  # idempotent


def test_a_cpu_without_the_kernel_holds_nothing_back():
    model = _layer(forced=False)
    assert keep_training_layout(model) == 0 and not hasattr(model[0], HELD_MARK)


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_forward_scenarios_leave_no_weight_packed_and_every_lora_gets_a_gradient(family, monkeypatch, name):
    import bitsandbytes.nn.modules as bnb_modules

    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.probes.forward.grad_flow import grad_flow_probe
    from workbench.probes.forward.scenarios import forward_scenarios_probe

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: True)  # layers are built as on an AVX-512 bf16 CPU
    target = resolve_target(str(family(name)), setup="qlora", quant="4bit")
    prepared = prepare_model(target)
    held = [n for n, m in prepared.model.named_modules() if getattr(m, HELD_MARK, False)]
    assert held and not any(getattr(m, REPACK_FLAG, False) for m in prepared.model.modules())
    forward = forward_scenarios_probe(prepared, target)
    assert packed_for_cpu_inference(prepared.model) == []
    grads = grad_flow_probe(prepared, target)
    found = {f.id: f for f in [*forward.findings(), *grads.findings()]}
    assert found["grad.flow"].verdict == "pass", found["grad.flow"].detail
    assert all(r.status == "ok" for r in grads.rows if r.role == "lora_B")
    for check in ("forward.scenarios", "forward.dtype_flow", "grad.flow"):
        assert f"kept the {len(held)} Linear4bit layers" in found[check].evidence["bitsandbytes_cpu_layout"]
    assert found["forward.scenarios"].verdict == "pass"


def test_a_setup_that_hands_over_packed_weights_is_named_by_grad_flow(family):
    import bitsandbytes

    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.probes.forward.grad_flow import grad_flow_probe

    target = resolve_target(str(family("llama")), setup="test_bnb_cpu_layout:evaluated_then_trained", quant="4bit")
    prepared = prepare_model(target)
    assert prepared.packed_at_setup and packed_for_cpu_inference(prepared.model) == []
    result = grad_flow_probe(prepared, target)
    finding = result.findings()[0]
    assert finding.verdict == "fail"
    assert prepared.packed_at_setup[0] in finding.title and bitsandbytes.__version__ in finding.detail
    assert finding.evidence["packed_for_cpu_inference"] == prepared.packed_at_setup[:40]
    assert REPACK_FLAG in finding.fix and "model.state_dict()" in finding.fix
    # the step itself ran on the training layout: every LoRA gets its gradient once the layout is fixed
    assert "receive a gradient" in finding.detail and result.findings_after_unpacking().verdict == "pass"


def test_the_fix_as_written_puts_packed_weights_back(family):
    """The fix's two steps on a model the set-up handed over packed: the flag off, then `model.state_dict()`."""
    model = evaluated_then_trained(str(family("llama")), quant="4bit")
    assert packed_for_cpu_inference(model)
    for module in model.modules():
        if hasattr(module, REPACK_FLAG):
            setattr(module, REPACK_FLAG, False)
    model.state_dict()
    assert packed_for_cpu_inference(model) == []


def test_no_note_for_layers_off_the_cpu():
    model = _layer(forced=True)
    keep_training_layout(model)
    assert "kept the 1 Linear4bit layers" in held_layout_note(model)
    model[0].weight = torch.nn.Parameter(torch.empty(0, device="meta"), requires_grad=False)  # as on another device
    assert held_layout_note(model) is None


def test_a_healthy_qlora_setup_hands_over_nothing_packed(family):
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.probes.forward.grad_flow import grad_flow_probe

    target = resolve_target(str(family("qwen2_tied")), setup="qlora", quant="4bit")
    prepared = prepare_model(target)
    assert prepared.packed_at_setup == []
    finding = grad_flow_probe(prepared, target).findings()[0]
    assert finding.verdict == "pass" and "packed_for_cpu_inference" not in finding.evidence
