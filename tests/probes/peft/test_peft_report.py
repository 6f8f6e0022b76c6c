import pytest

from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.peft.probes import peft_attribute_probe, peft_layer_status_probe, with_setup_attributes


def test_stage2_attributes_survive_and_forwarding_is_marked(demo):
    target = resolve_target(str(demo.qwen_stage2), quant="4bit", setup="qlora", gpus=2)
    report = peft_attribute_probe(target)
    steps = [s.step for s in report.snapshots]
    assert steps == ["raw model", "prepare_model_for_kbit_training", "PeftModel.from_pretrained",
                     "Trainer (n_gpu=2)"]
    peft_step = report.snapshots[2]
    assert peft_step.values["is_loaded_in_4bit"] == "True" and peft_step.how["is_loaded_in_4bit"] == "forwarded"
    assert report.snapshots[1].values["is_gradient_checkpointing"] == "True"
    assert report.findings()[0].verdict == "info"


def test_a_wrapper_that_drops_attributes_fails(demo, tmp_path, monkeypatch):
    (tmp_path / "wrapping_recipe.py").write_text(
        "import torch\n"
        "from workbench.model.setups import qlora\n"
        "class Wrapper(torch.nn.Module):\n"
        "    def __init__(self, inner):\n"
        "        super().__init__()\n"
        "        self.inner = inner\n"
        "def load(checkpoint, adapter=None, **options):\n"
        "    return Wrapper(qlora(checkpoint, adapter=adapter))\n")
    monkeypatch.chdir(tmp_path)
    target = resolve_target(str(demo.qwen_stage2), quant="4bit", setup="wrapping_recipe:load")
    chain = peft_attribute_probe(target)
    assert chain.findings()[0].verdict == "info"  # the standard chain keeps everything
    finding = with_setup_attributes(chain, prepare_model(target), target).findings()[0]
    assert finding.verdict == "fail"
    assert "is_loaded_in_4bit" in finding.detail and "your set-up (wrapping_recipe:load)" in finding.detail


def test_layer_status_from_peft(demo):
    prepared = prepare_model(resolve_target(str(demo.qwen_stage2), quant="4bit", setup="qlora"))
    report = peft_layer_status_probe(prepared)
    assert report.model_status["num_adapter_layers"] == 14 == len(report.layers)
    assert all(r["A/B dtype"] == "float32" and r["base compute dtype"] == "bfloat16" for r in report.layers)
    finding = report.findings()[0]
    assert finding.verdict == "info" and "14 layer(s)" in finding.detail


def test_irregular_requires_grad_warns(demo):
    prepared = prepare_model(resolve_target(str(demo.qwen_stage2), quant="4bit", setup="qlora"))
    for name, p in prepared.model.named_parameters():
        if "layers.0.self_attn.q_proj.lora_" in name:
            p.requires_grad_(False)
    finding = peft_layer_status_probe(prepared).findings()[0]
    assert finding.verdict == "warn" and "requires_grad" in finding.title


def test_no_adapter_is_a_skip(demo):
    finding = peft_layer_status_probe(prepare_model(resolve_target(str(demo.llama)))).findings()[0]
    assert finding.verdict == "skip"


def _save_tiny(folder, class_name, config_name, **config):
    import torch
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, class_name)(getattr(transformers, config_name)(**config))
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def test_a_model_peft_cannot_adapt_makes_the_attribute_chain_skip(tmp_path):
    # I-BERT's layers are QuantLinear / QuantEmbedding: no LoRA layer of PEFT wraps them
    from workbench.recorder import FindingsRecorder

    folder = _save_tiny(tmp_path / "ibert", "IBertForSequenceClassification", "IBertConfig", vocab_size=64,
                        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=40)
    recorder = FindingsRecorder(tmp_path / "sidecar.json", "03_peft_attributes")
    recorder.run(peft_attribute_probe, resolve_target(str(folder)), checks=("peft.attributes",))
    [finding] = recorder.findings
    assert finding.verdict == "skip" and finding.title == "PEFT cannot put a LoRA on IBertForSequenceClassification"


@pytest.mark.parametrize("quant", ["none", "4bit"])
def test_the_attribute_chain_wraps_mamba_with_the_layers_peft_accepts(tmp_path, quant):
    folder = _save_tiny(tmp_path / "mamba", "MambaForCausalLM", "MambaConfig", vocab_size=64, hidden_size=32,
                        num_hidden_layers=1, state_size=4, expand=2)
    report = peft_attribute_probe(resolve_target(str(folder), quant=quant))
    assert report.findings()[0].verdict == "info"
    assert report.snapshots[-2].step == "get_peft_model" and report.snapshots[-2].trainable > 0
