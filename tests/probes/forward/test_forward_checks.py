import dataclasses

import pytest
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


def test_a_batch_the_model_rejects_is_an_error_on_every_forward_check_never_a_fail(demo, tmp_path):
    from safetensors.torch import save_file

    from workbench.recorder import FindingsRecorder

    target = resolve_target(str(demo.llama))
    prepared = prepare_model(target)
    bad = tmp_path / "bad.safetensors"
    save_file({"not_an_argument": torch.zeros(1, 4, dtype=torch.long)}, str(bad))
    target.params["forward_inputs"] = str(bad)
    recorder = FindingsRecorder(tmp_path / "findings.json", notebook="04_forward_checks")
    for probe, checks in ((grad_flow_probe, ("grad.flow",)),
                          (mixed_precision_buffer_probe, ("forward.mixed_precision_buffers",)),
                          (forward_scenarios_probe, ("forward.scenarios", "forward.dtype_flow"))):
        recorder.run(probe, prepared, target, checks=checks)
    found = {f.id: f for f in recorder.findings}
    assert {f.verdict for f in found.values()} == {"error"}, [(f.id, f.verdict) for f in found.values()]
    scenarios = found["forward.scenarios"]
    assert scenarios.title == "Could not build a batch this model accepts"
    assert "bad.safetensors" in scenarios.detail and "input_ids" in scenarios.detail  # the batch and its exception
    assert scenarios.evidence["candidates"][0]["error"].startswith("ValueError")
    assert "forward_inputs" in scenarios.fix
    good = tmp_path / "good.safetensors"
    save_file({"input_ids": torch.tensor([[1, 2, 3, 4]])}, str(good))
    target.params["forward_inputs"] = str(good)
    report = forward_scenarios_probe(prepared, target)
    assert "good.safetensors" in report.inputs_how and verdicts(report)["forward.scenarios"].verdict == "pass"


def test_the_planted_fp32_norm_still_fails_the_matrix_the_batch_runs_under_autocast(demo):
    from workbench.model.batch import accepted_batch

    target = resolve_target(str(demo.qwen_base))
    prepared = prepare_model(target)
    prepared.model.model.language_model.norm.float()  # eval without autocast raises; autocast runs
    assert accepted_batch(prepared.model, target).rejected == []
    assert verdicts(forward_scenarios_probe(prepared, target))["forward.scenarios"].verdict == "fail"


def test_out_of_memory_is_an_error_that_says_so(demo, tmp_path):
    target = resolve_target(str(demo.llama))
    prepared = prepare_model(target)
    layer = prepared.model.model.layers[0]

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    layer.forward = exhausted
    from workbench.recorder import FindingsRecorder

    recorder = FindingsRecorder(tmp_path / "findings.json", notebook="04_forward_checks")
    recorder.run(forward_scenarios_probe, prepared, target, checks=("forward.scenarios", "forward.dtype_flow"))
    found = {f.id: f for f in recorder.findings}
    assert found["forward.scenarios"].verdict == "error" and "out of memory" in found["forward.scenarios"].title
    assert "2.00 GiB" in found["forward.scenarios"].detail and "smaller input" in found["forward.scenarios"].fix


def test_the_matrix_runs_each_distinct_forward_once_and_a_cell_it_does_not_run_equals_running_it(demo):
    """On this torch a thread started under autocast runs without it, and autocast does not cast to fp32: those
    cells take their mode's no-autocast result; the eval / no-autocast cell is the forward that accepted the batch.
    Run anyway, each gives that result (on the planted fp32 norm before a bf16 head, where they fail, and on the
    healthy model); the forwards the probe runs are the distinct ones left: eval under autocast, train without
    (traced) and with it."""
    import dataclasses

    from workbench.model.batch import target_inputs
    from workbench.model.forward import run_forward
    from workbench.probes.forward.scenarios import _describe, autocast_reaches_a_new_thread, run_matrix

    assert not autocast_reaches_a_new_thread("cpu", torch.bfloat16)  # asked of torch in a thread
    for planted in (True, False):
        target = resolve_target(str(demo.qwen_base))
        prepared = prepare_model(target)
        model = prepared.model
        if planted:
            model.model.language_model.norm.float()
        inputs, _ = target_inputs(model, target)  # the forward that accepts the batch (under autocast if planted)
        calls = []
        hook = model.register_forward_pre_hook(lambda module, args: calls.append(module.training))
        report = forward_scenarios_probe(prepared, target)
        hook.remove()
        compute = getattr(torch, report.compute_dtype)
        assert compute == torch.bfloat16 and len(report.cells) == 6
        # planted: eval / no autocast raised in the batch check, so it runs, and as the first failing cell it is traced
        assert calls == ([False, True, True] if not planted else [False, False, True, True, False])
        derived = [c for c in report.cells if c.same_as]
        html = report.view().html()  # the grid says which cells share a forward, and whose
        assert "train / replica thread under autocast: not run again, the same forward as no autocast (a thread " \
               "started under autocast runs without it" in html
        assert [(c.mode, c.context) for c in derived] == (
            [("eval", "no autocast")] * (not planted) + [("eval", "replica thread under autocast"),
                                                         ("train", "replica thread under autocast")])
        fresh, _ = run_matrix(model, inputs, compute)  # every cell of its own but the replicas
        assert [dataclasses.replace(c, same_as=None) for c in report.cells if c.context != "replica thread under "
                "autocast"] == [c for c in fresh if not c.same_as]
        for c in derived:
            model.train(c.mode == "train")
            out, exc = run_forward(model, inputs, c.context, compute)
            ran = (dataclasses.replace(c, ok=False, error=_describe(exc), dtype=None, shape=None) if exc is not None
                   else dataclasses.replace(c, ok=True, error=None, dtype=str(out.logits.dtype).removeprefix("torch."),
                                            shape=tuple(out.logits.shape)))
            assert ran == c and c.ok is not planted, (ran, c)
    fp32 = torch.nn.Linear(4, 4)
    assert [c.same_as for c in run_matrix(fp32, {"input": torch.ones(2, 4)}, torch.float32)[0]][:3] == [
        None, "no autocast (autocast does not cast to float32: no context)",
        "no autocast (autocast does not cast to float32: no context)"]


def test_the_train_autocast_cell_is_grad_flows_forward_when_it_ran_first(demo):
    """grad.flow's training step is the train / autocast forward of the accepted batch: the matrix run after it
    reads that cell (and says whose forward it is) instead of running it, and it equals the cell run anew."""
    import dataclasses

    from workbench.model.batch import target_inputs
    from workbench.probes.forward.grad_flow import grad_flow_probe
    from workbench.probes.forward.scenarios import run_matrix

    target = resolve_target(str(demo.qwen_base))
    prepared = prepare_model(target)
    model = prepared.model
    assert grad_flow_probe(prepared, target).findings()[0].verdict == "pass"
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(module.training))
    report = forward_scenarios_probe(prepared, target)
    hook.remove()
    assert calls == [False, True]  # eval / autocast, train / no autocast (traced): train / autocast not run again
    shared = next(c for c in report.cells if (c.variant, c.mode, c.context) == ("as prepared", "train", "autocast"))
    assert shared.same_as == "grad.flow's training step (train, autocast, these inputs)"
    inputs, _ = target_inputs(model, target)
    fresh = next(c for c in run_matrix(model, inputs, torch.bfloat16)[0] if (c.mode, c.context) == ("train", "autocast"))
    assert dataclasses.replace(shared, same_as=None) == fresh


@pytest.mark.parametrize("name", ["llama", "qwen2_tied"])
def test_the_traced_cell_is_the_buffer_probes_forward_where_its_cast_changed_nothing(family, name):
    """Every parameter already in the compute dtype and no floating input: forward.mixed_precision_buffers' traced
    forward is the model as prepared, train mode, no autocast, on the batch — the matrix's traced cell. Run after it
    (and after grad.flow), the matrix runs only eval / autocast, and its cells, dtype flow and diagnosis equal those
    of a matrix that runs every forward itself."""
    from workbench.model.batch import _ACCEPTED

    target = resolve_target(str(family(name)))
    prepared = prepare_model(target)
    model = prepared.model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # what families.py saves: nothing to cast
    alone = forward_scenarios_probe(prepared, target)  # every distinct forward of its own
    _ACCEPTED.pop(model)  # the batch built again, with no forward remembered
    grad_flow_probe(prepared, target)
    assert mixed_precision_buffer_probe(prepared, target).findings()[0].verdict in ("pass", "info")
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(module.training))
    shared = forward_scenarios_probe(prepared, target)
    hook.remove()
    assert calls == [False]  # eval / autocast only
    traced = next(c for c in shared.cells if (c.variant, c.mode, c.context) == ("as prepared", "train", "no autocast"))
    assert traced.same_as == ("forward.mixed_precision_buffers' traced forward (train, no autocast, these inputs)")
    assert [dataclasses.replace(c, same_as=None) for c in shared.cells] == \
        [dataclasses.replace(c, same_as=None) for c in alone.cells]
    assert shared.flow == alone.flow and shared.diagnosis == alone.diagnosis
    assert [f.verdict for f in shared.findings()] == [f.verdict for f in alone.findings()]


@pytest.mark.parametrize("name", ["llama", "qwen2_tied", "mixtral", "gemma3_text", "qwen2_vl"])
def test_the_replica_threads_forward_in_02_is_the_traced_cell_the_buffer_probe_and_the_matrix_read(family, name):
    """02's DataParallel replica runs the model as prepared in training mode without autocast or grad, on the batch,
    under the dtype tracer: forward.mixed_precision_buffers reads that trace instead of running its forward, and the
    matrix's traced cell is it. Verdicts, cells, dtype flow and diagnosis equal those of probes that run their own
    forwards; only the thread the flow ran in differs."""
    from workbench.model.batch import _ACCEPTED
    from workbench.probes.parallel.probes import trainer_wrap_probe

    target = resolve_target(str(family(name)), gpus=2)
    prepared = prepare_model(target)
    model = prepared.model
    alone_buffers = mixed_precision_buffer_probe(prepared, target)
    alone = forward_scenarios_probe(prepared, target)
    _ACCEPTED.pop(model)  # the batch built again, with no forward remembered
    assert trainer_wrap_probe(prepared, target).replica[1].ok
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(module.training))
    shared_buffers = mixed_precision_buffer_probe(prepared, target)
    assert calls == []  # no forward of its own
    shared = forward_scenarios_probe(prepared, target)
    hook.remove()
    assert calls == [False, True]  # eval / autocast, train / autocast: the traced cell is not run again
    traced = next(c for c in shared.cells if (c.variant, c.mode, c.context) == ("as prepared", "train", "no autocast"))
    assert traced.same_as == "02's replica thread forward (train, no autocast, these inputs)"
    assert [f.to_dict() for f in shared_buffers.findings()] == [f.to_dict() for f in alone_buffers.findings()]
    assert [dataclasses.replace(c, same_as=None) for c in shared.cells] == \
        [dataclasses.replace(c, same_as=None) for c in alone.cells]
    assert {row.pop("thread") for row in shared.flow} == {"replica-0"}
    assert {row.pop("thread") for row in alone.flow} == {"MainThread"}
    assert shared.flow == alone.flow and shared.diagnosis == alone.diagnosis
    assert [f.verdict for f in shared.findings()] == [f.verdict for f in alone.findings()]
