import pytest

from workbench.errors import UsageError
from workbench.model.setups import prepare_model, resolve_setup
from workbench.model.target import resolve_target


def test_plain_applies_the_adapter_for_inference(demo):
    prepared = prepare_model(resolve_target(str(demo.qwen_stage2)))
    assert type(prepared.model).__name__.startswith("PeftModel")
    assert not any(p.requires_grad for p in prepared.model.parameters())
    assert prepared.processor is not None  # the tokenizer saved beside the base


def test_qlora_continues_the_adapter_trainable_on_4bit(demo):
    prepared = prepare_model(resolve_target(str(demo.qwen_stage2), setup="qlora", quant="4bit"))
    trainable = [n for n, p in prepared.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert getattr(prepared.model.get_base_model(), "is_loaded_in_4bit", False)


def test_sft_takes_trls_own_preparation(demo):
    prepared = prepare_model(resolve_target(str(demo.llama), setup="sft"))
    trainable = [n for n, p in prepared.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_user_setup_may_return_model_and_processor(demo, tmp_path, monkeypatch):
    (tmp_path / "user_recipe.py").write_text(
        "from transformers import AutoModelForCausalLM\n"
        "def load(checkpoint, quant='none'):\n"
        "    return AutoModelForCausalLM.from_pretrained(checkpoint), 'my-processor'\n")
    monkeypatch.chdir(tmp_path)
    prepared = prepare_model(resolve_target(str(demo.llama), setup="user_recipe:load"))
    assert prepared.processor == "my-processor" and prepared.setup == "user_recipe:load"


@pytest.mark.parametrize("spec, message", [("nope", "module:function"), ("json:no_such_function", "no callable")])
def test_bad_setup_specs(spec, message):
    with pytest.raises(UsageError, match=message):
        resolve_setup(spec)
