"""adapter.targets on adapters PEFT itself built: a list that partly matches nothing (Phi-3's fused projections,
LLaMA-Factory #4020) warns, its healthy twins stay quiet, and every fix is built from the base's own names and
paths — as written in the fix, it builds with PEFT and reaches what it says."""

import ast
import re
from pathlib import Path

import pytest
import torch

from workbench.probes.saved.adapter_targets import adapter_targets_probe
from workbench.probes.saved.files import saved_files

UNFUSED = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj", "down_proj"]


def finding(base: Path, adapter: Path):
    [f] = adapter_targets_probe(saved_files(base, adapter)).findings()
    assert f.id == "adapter.targets" and f.evidence is not None
    if f.verdict in ("warn", "fail"):
        assert f.fix
    return f


def peft_adapter(model, out: Path, **lora) -> tuple[Path, list[str]]:
    """The adapter PEFT builds on `model`, saved; and the modules PEFT wrapped."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, **lora))
    peft_model.save_pretrained(out)
    return out, sorted(peft_model.targeted_module_names)


def fix_list(fix: str) -> list[str]:
    return ast.literal_eval(re.search(r"target_modules=(\[[^\]]*\])", fix).group(1))


def fix_regex(fix: str, key: str = "target_modules") -> str:
    return re.search(key + r'=r"([^"]+)"', fix).group(1)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> Path:
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("phi3") / "base"
    Phi3ForCausalLM(Phi3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    return folder


def phi3_model(folder: Path):
    from transformers import Phi3ForCausalLM

    return Phi3ForCausalLM.from_pretrained(folder)


def test_unfused_names_on_phi3_warn_naming_each_dead_entry_and_the_fused_names(phi3, tmp_path):
    adapter, wrapped = peft_adapter(phi3_model(phi3), tmp_path / "unfused", target_modules=UNFUSED,
                                    task_type="CAUSAL_LM")
    assert {m.rsplit(".", 1)[-1] for m in wrapped} == {"o_proj", "down_proj"}  # PEFT built it, silently
    f = finding(phi3, adapter)
    assert f.verdict == "warn"
    assert "gate_proj, k_proj, q_proj, up_proj, v_proj match nothing" in f.title
    assert "only down_proj, o_proj train" in f.title
    assert f.evidence["unmatched_entries"] == ["gate_proj", "k_proj", "q_proj", "up_proj", "v_proj"]
    assert f.evidence["counterparts"]["q_proj"] == ["qkv_proj"] and f.evidence["counterparts"]["up_proj"] == [
        "gate_up_proj"]
    assert {"qkv_proj", "gate_up_proj", "o_proj", "down_proj"} <= set(f.evidence["adaptable_names"]["language"])
    suggested = fix_list(f.fix)
    assert set(suggested) == {"qkv_proj", "gate_up_proj", "o_proj", "down_proj"}
    # the fix, as written, trains every projection of Phi-3 and the probe is quiet about it
    fixed, wrapped = peft_adapter(phi3_model(phi3), tmp_path / "fixed", target_modules=suggested,
                                  task_type="CAUSAL_LM")
    assert len(wrapped) == 8 and finding(phi3, fixed).verdict == "info"


@pytest.mark.parametrize("targets", [["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], "all-linear"])
def test_the_healthy_phi3_twins_stay_quiet(phi3, tmp_path, targets):
    adapter, wrapped = peft_adapter(phi3_model(phi3), tmp_path / "healthy", target_modules=targets,
                                    task_type="CAUSAL_LM")
    f = finding(phi3, adapter)
    assert f.verdict == "info" and f.evidence["matched_per_component"] == {"language": 8}, f
    assert not f.evidence["unmatched_entries"]


def test_regex_alternatives_that_match_nothing_warn_and_the_fix_keeps_the_users_regex(phi3, tmp_path):
    adapter, _ = peft_adapter(phi3_model(phi3), tmp_path / "regex", target_modules=r".*\.(q_proj|v_proj|o_proj)")
    f = finding(phi3, adapter)
    assert f.verdict == "warn" and "regex alternatives q_proj, v_proj match nothing" in f.title
    regex = fix_regex(f.fix)
    assert regex == r".*\.(qkv_proj|o_proj)"  # the user's own regex, its group holding this base's names
    _, wrapped = peft_adapter(phi3_model(phi3), tmp_path / "regex-fixed", target_modules=regex)
    assert {m.rsplit(".", 1)[-1] for m in wrapped} == {"qkv_proj", "o_proj"}


def test_a_list_written_for_several_architectures_is_not_a_false_alarm(family, tmp_path):
    from transformers import AutoModelForCausalLM

    llama = family("llama")
    adapter, _ = peft_adapter(AutoModelForCausalLM.from_pretrained(llama), tmp_path / "union",
                              target_modules=["q_proj", "v_proj", "qkv_proj"], task_type="CAUSAL_LM")
    f = finding(llama, adapter)  # qkv_proj (Phi-3's name) matches nothing, but q_proj and v_proj train
    assert f.verdict == "info" and f.title == "target_modules matches 4 module(s): language 4"
    assert "qkv_proj matches nothing here, and its role is trained under q_proj, v_proj" in f.detail


def test_a_name_list_reaching_the_vision_tower_gets_a_fix_built_from_this_bases_paths(family, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    llava = family("llava")
    adapter, _ = peft_adapter(AutoModelForImageTextToText.from_pretrained(llava), tmp_path / "list",
                              target_modules=["q_proj", "v_proj"])
    f = finding(llava, adapter)
    assert f.verdict == "warn" and "vision-tower" in f.title
    regex, exclude = fix_regex(f.fix), fix_regex(f.fix, "exclude_modules")
    assert regex == r"model\.language_model\.(?:.*\.)?(q_proj|v_proj)" and exclude == r"model\.vision_tower\..*"
    language = {f"model.language_model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")}
    for lora in (dict(target_modules=regex), dict(target_modules=["q_proj", "v_proj"], exclude_modules=exclude)):
        peft_model = get_peft_model(AutoModelForImageTextToText.from_pretrained(llava), LoraConfig(r=2, **lora))
        assert set(peft_model.targeted_module_names) == language, lora


def test_a_vlm_regex_on_a_text_model_fails_with_a_fix_from_the_text_models_names(family, tmp_path, edit_json):
    from transformers import AutoModelForCausalLM

    llama = family("llama")
    adapter, _ = peft_adapter(AutoModelForCausalLM.from_pretrained(llama), tmp_path / "vlm-regex",
                              target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    edit_json(adapter / "adapter_config.json", target_modules=r".*language_model.*\.(q_proj|v_proj)")
    f = finding(llama, adapter)
    assert f.verdict == "fail" and "matches no module" in f.title
    assert "language_model" not in f.fix and fix_list(f.fix) == ["q_proj", "v_proj"]
    assert str(llama) in f.fix  # the base it was matched on, and the one the adapter records


def test_unfused_names_on_a_fused_moe_point_at_its_expert_parameters(family, tmp_path):
    from transformers import AutoModelForCausalLM

    mixtral = family("mixtral")  # transformers 5 stacks the experts: experts.gate_up_proj / experts.down_proj
    adapter, wrapped = peft_adapter(AutoModelForCausalLM.from_pretrained(mixtral), tmp_path / "unfused",
                                    target_modules=UNFUSED, task_type="CAUSAL_LM")
    assert len(wrapped) == 8  # attention only: no expert trains
    f = finding(mixtral, adapter)
    assert f.verdict == "warn" and "down_proj, gate_proj, up_proj match nothing" in f.title
    assert f.evidence["parameter_counterparts"]["gate_proj"] == ["experts.gate_up_proj"]
    assert "gate" not in fix_list(f.fix)  # never the router, though it is named gate
    params = ast.literal_eval(re.search(r"target_parameters=(\[[^\]]*\])", f.fix).group(1))
    assert params == ["experts.down_proj", "experts.gate_up_proj"]
    fixed, _ = peft_adapter(AutoModelForCausalLM.from_pretrained(mixtral), tmp_path / "fixed",
                            target_modules=fix_list(f.fix), target_parameters=params, task_type="CAUSAL_LM")
    f = finding(mixtral, fixed)  # as written, it builds; its saved experts.base_layer keys are no missing module
    assert f.verdict == "info" and "4 parameter(s) matched" in f.detail, f


def trained(peft_model):
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    return peft_model


@pytest.mark.parametrize("name", ["llama", "qwen2_tied", "gemma3_text", "gpt2", "mixtral", "t5", "bert_seq_cls",
                                  "bert_token_cls", "bert_encoder", "qwen2_vl"])
@pytest.mark.parametrize("targets", [None, "all-linear"])
def test_the_adapters_peft_builds_on_every_family_stay_quiet(family, tmp_path, name, targets):
    # the workbench's own fresh LoRA (PEFT task type of the head; its projections or all-linear, the classifier
    # excluded): PEFT's SEQ_CLS / TOKEN_CLS add both `classifier` and `score` to modules_to_save, and its TOKEN_CLS
    # all-linear lists `classifier` while excluding it — none of that is a defect
    import transformers
    from peft import get_peft_model

    from workbench.demo.families import FAMILIES
    from workbench.model.setups import lora_config_for
    from workbench.probes.saved.adapter_weights import adapter_weights_probe

    if name == "qwen2_vl" and targets:
        pytest.skip("all-linear on a VLM reaches its vision tower: a warn by design (the llava test)")
    base = family(name)
    model = getattr(transformers, FAMILIES[name].model_class).from_pretrained(base)
    config = lora_config_for(model, **({"target_modules": targets} if targets else {}))
    trained(get_peft_model(model, config)).save_pretrained(tmp_path / "adapter")
    files = saved_files(base, tmp_path / "adapter")
    [f] = adapter_targets_probe(files).findings()
    assert f.verdict == "info" and f.evidence["matched_per_component"], f
    assert adapter_weights_probe(files).findings()[0].verdict == "pass"


def test_all_linear_on_a_siglip_pooling_head_names_its_inert_out_proj_not_an_unwrappable_module(family, tmp_path):
    from transformers import AutoModelForImageTextToText

    gemma = family("gemma3_vlm")
    adapter, wrapped = peft_adapter(AutoModelForImageTextToText.from_pretrained(gemma), tmp_path / "all-linear",
                                    target_modules="all-linear")
    inert = "model.vision_tower.head.attention.out_proj"
    assert inert in wrapped  # PEFT wraps it (a Linear subclass) ...
    f = finding(gemma, adapter)  # ... but nn.MultiheadAttention reads out_proj.weight itself: its LoRA never runs
    assert f.verdict == "warn" and "cannot wrap" not in f.detail
    assert f"inside an nn.MultiheadAttention matched ({inert})" in f.detail and f"exclude_modules=['{inert}']" in f.fix
