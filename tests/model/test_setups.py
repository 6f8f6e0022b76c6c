import pytest
import torch

from workbench.errors import NotApplicable, UsageError
from workbench.model.setups import LORA_TARGETS, lora_config_for, prepare_model, resolve_setup
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


def _tiny(class_name: str, config_name: str, **config):
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, class_name)(getattr(transformers, config_name)(**config))


def _distilbert():
    return _tiny("DistilBertForSequenceClassification", "DistilBertConfig", vocab_size=64, dim=32, n_layers=1,
                 n_heads=2, hidden_dim=64, max_position_embeddings=32)


def test_fresh_lora_keeps_modules_to_saves_suffix_match_off_the_lora():
    # PEFT's SEQ_CLS adds "classifier" to modules_to_save and wraps every module whose name ends with it:
    # DistilBERT's pre_classifier, which all-linear gave a LoRA, so PEFT's own all-linear refuses DistilBERT
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import ModulesToSaveWrapper

    with pytest.raises(TypeError, match="modules_to_save cannot be applied"):
        get_peft_model(_distilbert(), LoraConfig(target_modules="all-linear", task_type="SEQ_CLS"))
    model = _distilbert()
    config = lora_config_for(model)
    assert sorted(config.target_modules) == ["k_lin", "lin1", "lin2", "out_lin", "q_lin", "v_lin"]
    wrapped = get_peft_model(model, config)
    assert isinstance(wrapped.base_model.model.pre_classifier, ModulesToSaveWrapper)
    assert any("q_lin.lora_A" in n for n, p in wrapped.named_parameters() if p.requires_grad)


def test_fresh_lora_on_a_classifier_without_the_suffix_clash_is_peft_all_linear():
    from peft import LoraConfig, get_peft_model

    def bert():
        return _tiny("BertForSequenceClassification", "BertConfig", vocab_size=64, hidden_size=32,
                     num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)

    def lora_layers(config):
        return {n.rsplit(".lora_A", 1)[0] for n, _ in get_peft_model(bert(), config).named_modules()
                if n.endswith(".lora_A")}

    ours = lora_layers(lora_config_for(bert()))
    assert ours == lora_layers(LoraConfig(target_modules="all-linear", task_type="SEQ_CLS"))
    assert ours and not any("classifier" in n for n in ours)


def test_fresh_lora_leaves_out_the_layers_peft_refuses_on_mamba():
    from peft import LoraConfig, get_peft_model

    def mamba():
        return _tiny("MambaForCausalLM", "MambaConfig", vocab_size=64, hidden_size=32, num_hidden_layers=1,
                     state_size=4, expand=2)

    with pytest.raises(ValueError, match="incompatible with Mamba-based models"):
        get_peft_model(mamba(), LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM"))
    config = lora_config_for(mamba())
    assert sorted(config.target_modules) == ["dt_proj", "in_proj", "x_proj"]
    assert get_peft_model(mamba(), config).get_nb_trainable_parameters()[0] > 0


def test_the_usual_llm_projections_stay_the_targets():
    model = _tiny("LlamaForCausalLM", "LlamaConfig", vocab_size=64, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    assert sorted(lora_config_for(model).target_modules) == sorted(LORA_TARGETS)


def _ibert():
    return _tiny("IBertForSequenceClassification", "IBertConfig", vocab_size=64, hidden_size=32,
                 num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=40)


def test_a_model_peft_cannot_adapt_is_not_applicable():
    # I-BERT's projections are QuantLinear, which no PEFT LoRA layer wraps; only its classifier head is nn.Linear
    with pytest.raises(NotApplicable) as info:
        lora_config_for(_ibert())
    assert info.value.title == "PEFT cannot put a LoRA on IBertForSequenceClassification"
    assert "QuantLinear" in str(info.value) and "--setup plain" in str(info.value)


def test_explicit_targets_are_taken_as_given():
    assert lora_config_for(_ibert(), target_modules=["query"]).target_modules == {"query"}


def test_qlora_checkpoints_non_reentrant(family, monkeypatch):
    from peft import prepare_model_for_kbit_training

    from workbench.model import setups
    from workbench.model.checkpointing import checkpointing_state

    target = resolve_target(str(family("llava")), setup="qlora", quant="4bit")
    state = checkpointing_state(prepare_model(target).model)
    assert state["enabled"] and state["use_reentrant"] is False
    # the planted twin: peft's own default passes no use_reentrant, and torch's checkpoint then runs reentrant
    monkeypatch.setattr(setups, "prepare_for_kbit_training",
                        lambda model: prepare_model_for_kbit_training(model, use_gradient_checkpointing=True))
    state = checkpointing_state(prepare_model(target).model)
    assert state["enabled"] and state["use_reentrant"] is None


def _vision_lora_grads(model, target) -> dict[str, bool]:
    from workbench.model.batch import target_inputs

    inputs, _ = target_inputs(model, target)
    model.train()
    model(**inputs).loss.backward()
    return {n: p.grad is not None and bool(p.grad.abs().sum()) for n, p in model.named_parameters()
            if "lora_B" in n and ".visual." in n}


@pytest.mark.slow
def test_qlora_trains_the_vision_towers_lora_where_peft_defaults_send_it_no_gradient(tmp_path, monkeypatch):
    # GLM-4V's vision tower has no input embeddings for enable_input_require_grads to hook: under reentrant
    # checkpointing its blocks see inputs without grad
    from peft import prepare_model_for_kbit_training

    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import architectures
    from workbench.model import setups

    folder = build_tiny_checkpoint(next(a for a in architectures() if a.model_type == "glm4v"), tmp_path)
    target = resolve_target(str(folder), setup="qlora", quant="4bit")
    fixed = _vision_lora_grads(prepare_model(target).model, target)
    # the planted twin: peft's defaults (reentrant checkpointing, only the text embeddings' output requires grad)
    monkeypatch.setattr(setups, "prepare_for_kbit_training",
                        lambda model: prepare_model_for_kbit_training(model, use_gradient_checkpointing=True))
    planted = _vision_lora_grads(prepare_model(target).model, target)
    starved = [n for n, ok in planted.items() if not ok]
    assert fixed.keys() == planted.keys() and all(fixed.values()) and starved, (fixed, planted)
    assert all(".blocks." in n for n in starved)  # the checkpointed blocks; the merger after them still learns


@pytest.mark.slow
def test_a_model_whose_tied_embeddings_peft_cannot_read_is_not_applicable(tmp_path):
    # PP-FormulaNet declares tied weights, and its get_input_embeddings raises NotImplementedError, which
    # get_peft_model calls to find the tied modules; GPT-2 (tied, readable) is the healthy twin
    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import architectures
    from workbench.model.loading import load_pretrained

    folder = build_tiny_checkpoint(next(a for a in architectures() if a.model_type == "pp_formulanet"), tmp_path)
    with pytest.raises(NotApplicable) as info:
        lora_config_for(load_pretrained(folder))
    assert info.value.title == "PEFT cannot put a LoRA on PPFormulaNetForConditionalGeneration"
    assert "get_input_embeddings" in str(info.value)
    gpt2 = _tiny("GPT2LMHeadModel", "GPT2Config", vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    assert sorted(lora_config_for(gpt2).target_modules) == ["c_attn", "c_fc", "c_proj"]



def test_a_trainer_is_recognised_without_importing_the_trainer_module_for_anything_else(tmp_path, monkeypatch):
    import sys

    from transformers import Trainer, TrainingArguments

    from workbench.model.setups import is_trainer

    trainer = Trainer(model=torch.nn.Linear(2, 2), args=TrainingArguments(str(tmp_path), report_to=[]))
    assert is_trainer(trainer) and not is_trainer(torch.nn.Linear(2, 2))
    monkeypatch.delitem(sys.modules, "transformers.trainer")  # a process that never imported it
    assert not is_trainer(torch.nn.Linear(2, 2)) and "transformers.trainer" not in sys.modules
