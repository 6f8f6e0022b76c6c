"""Zero false alarms on the heads people fine-tune: every family's healthy checkpoint, plain and with a LoRA, gets
no fail and no error from the forward matrix, gradient flow and the attribute chain; the inputs used are named;
planted defects are still named on a decoder-only model and on T5."""

import pytest

from workbench.model.heads import head_kind
from workbench.model.setups import PreparedModel, prepare_model
from workbench.model.target import resolve_target
from workbench.probes.forward.grad_flow import grad_flow_probe
from workbench.probes.forward.scenarios import forward_scenarios_probe
from workbench.probes.peft.probes import peft_attribute_probe

# bert_token_cls shares BERT's body with bert_seq_cls; its labels are checked in test_labels_fit_the_head
FAMILIES = ["llama", "qwen2_tied", "gpt2", "t5", "bert_seq_cls", "bert_encoder", "llava", "qwen2_vl", "gemma3_vlm"]
PEFT_TASK = {"causal_lm": "CAUSAL_LM", "image_text_to_text": "CAUSAL_LM", "seq2seq_lm": "SEQ_2_SEQ_LM",
             "seq_cls": "SEQ_CLS", "token_cls": "TOKEN_CLS", "encoder": "FEATURE_EXTRACTION"}


def by_id(findings):
    return {f.id: f for f in findings}


# the plain set-up (one forward per scenario) is the fast tier; the QLoRA one (a real 4-bit load and a training
# step per family) runs in `make test`
@pytest.mark.parametrize("setup", ["plain", pytest.param("qlora", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", FAMILIES)
def test_healthy_family_gives_no_fail_and_names_its_inputs(family, name, setup):
    from workbench.demo.families import FAMILIES as BUILT

    target = resolve_target(str(family(name)), setup=setup, quant="4bit" if setup == "qlora" else "none")
    prepared = prepare_model(target)
    assert head_kind(prepared.model) == BUILT[name].head
    forward = forward_scenarios_probe(prepared, target)
    grads = grad_flow_probe(prepared, target)
    findings = [*forward.findings(), *grads.findings(), *peft_attribute_probe(target).findings()]
    bad = [(f.id, f.verdict, f.title, f.detail[:200]) for f in findings if f.verdict in ("fail", "error", "skip")]
    assert not bad
    assert len(forward.cells) == (12 if setup == "qlora" else 6)
    for how in (forward.inputs_how, grads.inputs_how):
        if BUILT[name].head == "image_text_to_text":
            assert "image + text" in how and "image_token_id" in how
        assert "head:" in how
    found = by_id(findings)
    assert "Inputs:" in found["forward.scenarios"].detail and "Inputs:" in found["grad.flow"].detail
    if setup == "qlora":
        config = next(iter(prepared.model.peft_config.values()))
        assert config.task_type == PEFT_TASK[BUILT[name].head]


def test_labels_fit_the_head(family):
    from workbench.model.forward import with_labels
    from workbench.model.inputs import sample_inputs
    from workbench.model.loading import load_pretrained

    shapes = {}
    for name in ("bert_seq_cls", "bert_token_cls", "bert_encoder", "t5"):
        model = load_pretrained(family(name))
        inputs = with_labels(model, sample_inputs(model, family(name))[0])
        shapes[name] = tuple(inputs["labels"].shape) if "labels" in inputs else None
    assert shapes == {"bert_seq_cls": (1,), "bert_token_cls": (1, 16), "bert_encoder": None, "t5": (1, 16)}


def test_llava_clip_post_layernorm_is_off_the_loss_path_not_a_failure(family):
    target = resolve_target(str(family("llava")))
    finding = grad_flow_probe(prepare_model(target), target).findings()[0]
    assert finding.verdict == "info" and "post_layernorm" in finding.detail
    assert "never reaches the loss" in finding.detail


def test_a_vlm_no_image_batch_fits_is_not_blamed_for_its_unexercised_vision_tower(family, monkeypatch):
    import workbench.model.multimodal_inputs as mm

    target = resolve_target(str(family("llava")), setup="qlora", quant="4bit")
    prepared = prepare_model(target)
    for builder in ("vlm_inputs_from_image_processor", "vlm_inputs_from_config", "image_beside_text"):
        monkeypatch.setattr(mm, builder, lambda *_: None)  # no image batch: text only is what runs
    finding = grad_flow_probe(prepared, target).findings()[0]
    assert finding.verdict == "info", (finding.verdict, finding.title)
    assert "vision-tower tensors" in finding.detail and "not exercised" in finding.detail
    not_exercised = finding.evidence["not_exercised"]
    assert not_exercised and all("vision_tower" in name for name in not_exercised)
    never_run = finding.evidence["never_run"]  # counted apart from the tower a text-only batch never reaches
    assert (f"{len(never_run)} belong to modules" in finding.detail) if never_run else \
        ("belong to modules" not in finding.detail)
    assert finding.evidence["inputs"].startswith("16 random token ids")


def test_vlms_saved_without_a_processor_get_an_image_batch_from_the_model_contract(family):
    from workbench.model.batch import accepted_batch

    for name in ("llava", "qwen2_vl", "gemma3_vlm"):
        target = resolve_target(str(family(name)))
        batch = accepted_batch(prepare_model(target).model, target)
        assert "pixel_values" in batch.inputs and "image + text" in batch.how, (name, batch.how)


def _planted_reentrant(folder):
    from peft import get_peft_model

    from workbench.model.loading import load_pretrained
    from workbench.model.setups import lora_config_for

    model = load_pretrained(folder)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    peft_model = get_peft_model(model, lora_config_for(model))
    # transformers 5.23 and PEFT install the input-grad hook; older releases and hand-rolled loops did not
    # (on get_input_embeddings(), or on each stack's embed_tokens for T5)
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if hook.__name__.startswith("make_inputs_require_grad"):
                del module._forward_hooks[key]
    return PreparedModel(peft_model, None, "planted", "reentrant checkpointing, no input-grad hook")


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_reentrant_checkpointing_without_input_grads_is_named(family, name):
    prepared = _planted_reentrant(family(name))
    finding = grad_flow_probe(prepared, resolve_target(str(family(name)))).findings()[0]
    assert finding.verdict == "fail", (finding.title, finding.detail)
    assert "enable_input_require_grads" in finding.detail and "use_reentrant" in finding.fix


def test_adapter_loaded_for_inference_is_a_grad_flow_skip(demo):
    target = resolve_target(str(demo.qwen_stage2), setup="plain")
    finding = grad_flow_probe(prepare_model(target), target).findings()[0]
    assert finding.verdict == "skip" and "Nothing is trainable" in finding.detail


@pytest.mark.parametrize("name", ["t5", "bert_encoder", "bert_seq_cls"])
def test_trainer_wrap_and_buffers_fit_the_head(family, name):
    from workbench.probes.forward.mixed_precision_buffers import mixed_precision_buffer_probe
    from workbench.probes.parallel.probes import trainer_wrap_probe

    target = resolve_target(str(family(name)), gpus=2)
    prepared = prepare_model(target)
    found = by_id([*trainer_wrap_probe(prepared, target).findings(),
                   *mixed_precision_buffer_probe(prepared, target).findings()])
    # on 2 GPUs the Trainer wraps an unquantized model in DataParallel: warn while the replica forward survives
    assert found["parallel.trainer_wrap"].verdict == "warn", found["parallel.trainer_wrap"].detail
    assert found["forward.mixed_precision_buffers"].verdict == "pass"
