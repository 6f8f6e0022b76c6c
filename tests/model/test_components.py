from workbench.model.components import ComponentClassifier
from workbench.model.loading import load_pretrained


def test_qwen2vl_split_comes_from_structure(demo):
    model = load_pretrained(demo.qwen_base)
    classifier = ComponentClassifier.from_model(model)
    assert classifier.component_of("model.visual.blocks.0.attn.qkv.weight") == "vision"
    assert classifier.component_of("model.visual.merger.mlp.0.weight") == "vision"
    assert classifier.component_of("model.language_model.layers.1.mlp.up_proj.weight") == "language"
    assert classifier.component_of("model.language_model.embed_tokens.weight") == "language"
    assert classifier.component_of("lm_head.weight") == "head"
    names = [n for n, _ in model.named_parameters()]
    assert all(classifier.component_of(n) != "other" for n in names)


def test_llama_split_and_peft_wrapping(demo):
    from peft import LoraConfig, get_peft_model

    model = load_pretrained(demo.llama)
    classifier = ComponentClassifier.from_model(model)
    assert classifier.component_of("model.layers.0.self_attn.q_proj.weight") == "language"
    assert classifier.component_of("lm_head.weight") == "head"
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    wrapped = ComponentClassifier.from_model(peft_model)
    assert wrapped.component_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") == "language"
    assert wrapped.component_of("base_model.model.lm_head.weight") == "head"


def test_parameter_file_patterns_override(demo):
    model = load_pretrained(demo.llama)
    classifier = ComponentClassifier.from_model(model, {"head": [r"\.norm\.weight$"]})
    assert classifier.component_of("model.norm.weight") == "head"
