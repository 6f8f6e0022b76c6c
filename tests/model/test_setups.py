import pytest

from workbench.errors import NotApplicable, UsageError
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


OTHER_HEADS = [("bert_seq_cls", "BertForSequenceClassification", "sequence classification"),
               ("t5", "T5ForConditionalGeneration", "sequence-to-sequence LM")]


@pytest.mark.parametrize("name, model_class, head", OTHER_HEADS)
def test_sft_on_another_head_does_not_apply(family, name, model_class, head):
    from workbench.model.loading import LOADS

    with pytest.raises(NotApplicable) as info:
        prepare_model(resolve_target(str(family(name)), setup="sft"))
    assert info.value.title == f"The sft set-up does not apply to {model_class} ({head})"
    assert "trl's SFTTrainer, which trains causal LMs" in str(info.value) and "--setup plain" in str(info.value)
    assert not LOADS  # told from config.json: nothing was loaded


@pytest.mark.parametrize("name, model_class, head", OTHER_HEADS)
def test_sft_on_another_head_makes_the_checks_on_the_model_skip_not_error(family, tmp_path, name, model_class, head):
    from workbench.catalog import notebook
    from workbench.notebook import open_notebook

    for nb_name in ("01_dtype_distribution", "02_dataparallel", "03_peft_attributes", "04_forward_checks"):
        spec = notebook(nb_name)
        nb = open_notebook(nb_name, checkpoint=str(family(name)), setup="sft",
                           findings_path=str(tmp_path / f"{nb_name}.json"))
        for step in spec.steps:
            nb.run(step.name)
        found = {f.id: f for f in nb.recorder.findings}
        assert set(found) == set(spec.checks), nb_name
        assert not [f for f in found.values() if f.verdict == "error"], (nb_name, found)
        on_model = {c for step in spec.steps if "prepared" in step.args for c in step.reports}
        on_model.discard("peft.attributes")  # 03's attribute chain (its own plain load) answers it
        for check in on_model:
            f = found[check]
            assert f.verdict == "skip" and model_class in f.title and "SFTTrainer" in f.detail, (check, f)
        assert "does not apply" in nb.results["prepared"].view().html()


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
