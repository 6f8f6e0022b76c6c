"""Notebook 00: each check fires on a defect planted in a copy of a tiny checkpoint, and stays quiet on healthy ones
(the demo's checkpoints, a tied GPT-2, a tied and an untied Llama)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from workbench.probes.saved import adapter_targets as at
from workbench.probes.saved import adapter_weights as aw
from workbench.probes.saved import config_checks as cc
from workbench.probes.saved import tokenizer as tk
from workbench.probes.saved.files import saved_files

PROBES = {"adapter.weights": aw.adapter_weights_probe, "adapter.targets": at.adapter_targets_probe,
          "tokenizer.vocab": tk.tokenizer_vocab_probe, "tokenizer.special_tokens": tk.special_tokens_probe,
          "config.tied_embeddings": cc.tied_embeddings_probe, "config.quantization": cc.quantization_probe,
          "config.generation": cc.generation_config_probe}


def finding(check: str, model_dir, adapter_dir=None):
    [f] = PROBES[check](saved_files(Path(model_dir), Path(adapter_dir) if adapter_dir else None)).findings()
    assert f.id == check and f.evidence is not None
    if f.verdict in ("fail", "warn"):
        assert f.fix, f  # every defect carries a concrete fix
    return f


def verdicts(model_dir, adapter_dir=None) -> dict[str, str]:
    files = saved_files(Path(model_dir), Path(adapter_dir) if adapter_dir else None)
    return {c: p(files).findings()[0].verdict for c, p in PROBES.items()}


def rewrite_adapter(folder: Path, change) -> None:
    path = folder / "adapter_model.safetensors"
    tensors = load_file(str(path))
    tensors = change(tensors) or tensors
    save_file(tensors, str(path), metadata={"format": "pt"})


def tiny_llama(folder: Path, tied: bool, tokenizer_from: Path | None = None, same_head: bool = False) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                                         bos_token_id=None, eos_token_id=2, pad_token_id=0))
    if same_head:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.save_pretrained(folder)
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (tokenizer_from / name).exists():
                shutil.copy(tokenizer_from / name, folder / name)
    return folder


def lora_adapter(base: Path, out: Path, **lora) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, task_type="CAUSAL_LM", **lora))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llamas(demo, tmp_path_factory):
    root = tmp_path_factory.mktemp("llamas")
    return {"tied": tiny_llama(root / "tied", True, demo.llama),
            "untied": tiny_llama(root / "untied", False, demo.llama)}


# --- healthy checkpoints stay quiet ------------------------------------------------------------------------------
def test_the_demo_is_healthy_for_every_saved_files_check(demo):
    assert verdicts(demo.qwen_stage1, demo.qwen_stage2) == {
        "adapter.weights": "pass", "adapter.targets": "info", "tokenizer.vocab": "pass",
        "tokenizer.special_tokens": "pass", "config.tied_embeddings": "pass", "config.quantization": "pass",
        "config.generation": "pass"}
    for full in (demo.qwen_base, demo.qwen_stage1, demo.llama):
        v = verdicts(full)
        assert v.pop("adapter.weights") == v.pop("adapter.targets") == "skip"
        assert set(v.values()) == {"pass"}, (full, v)


def test_other_families_stay_quiet(llamas, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).save_pretrained(
        tmp_path / "gpt2")
    v = verdicts(tmp_path / "gpt2")  # tied, no tokenizer files
    assert v["config.tied_embeddings"] == "pass" and v["tokenizer.vocab"] == v["tokenizer.special_tokens"] == "skip"
    assert v["config.quantization"] == v["config.generation"] == "pass"
    for name in ("tied", "untied"):
        v = verdicts(llamas[name])
        assert {v[c] for c in v if not c.startswith("adapter.")} == {"pass"}, (name, v)
    adapter = lora_adapter(llamas["untied"], tmp_path / "adapter", target_modules=["q_proj", "v_proj"])
    v = verdicts(llamas["untied"], adapter)
    assert v["adapter.weights"] == "pass" and v["adapter.targets"] == "info", v
    assert "language 4" in finding("adapter.targets", llamas["untied"], adapter).title


# --- adapter.weights ---------------------------------------------------------------------------------------------
def test_an_empty_adapter_fails(demo, copy_of):
    zero3 = copy_of(demo.qwen_stage2, "zero3")
    rewrite_adapter(zero3, lambda t: {k: torch.empty(0, dtype=v.dtype) for k, v in t.items()})
    f = finding("adapter.weights", demo.qwen_stage1, zero3)
    assert f.verdict == "fail" and "shape [0]" in f.title and "ZeRO-3" in f.detail and "gather" in f.fix
    nothing = copy_of(demo.qwen_stage2, "nothing")
    save_file({}, str(nothing / "adapter_model.safetensors"))
    f = finding("adapter.weights", demo.qwen_stage1, nothing)
    assert f.verdict == "fail" and "holds no tensors" in f.title


def test_a_no_op_adapter_fails_and_a_half_untrained_one_warns_naming_what_never_moved(demo, copy_of):
    noop = copy_of(demo.qwen_stage2, "noop")
    rewrite_adapter(noop, lambda t: {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in t.items()})
    f = finding("adapter.weights", demo.qwen_stage1, noop)
    assert f.verdict == "fail" and "No-op adapter" in f.title and "14 modules" in f.title
    partly = copy_of(demo.qwen_stage2, "partly")
    rewrite_adapter(partly, lambda t: {k: torch.zeros_like(v) if "lora_B" in k and "layers.1." in k else v
                                       for k, v in t.items()})
    f = finding("adapter.weights", demo.qwen_stage1, partly)  # half of them: a warn naming them
    assert f.verdict == "warn" and "50% of the adapted modules never moved (7 of 14" in f.title
    assert "layers.1." in f.detail and f.evidence["never_moved_per_component"] == {"language": "7 of 14"}
    result = aw.adapter_weights_probe(saved_files(demo.qwen_stage1, partly))
    assert "data:image/png;base64" in result.view().html() and "‖B·A‖·scaling" in str(result)


def test_nan_in_an_adapter_fails(demo, copy_of):
    bad = copy_of(demo.qwen_stage2, "nan")

    def plant(t):
        key = sorted(k for k in t if "lora_A" in k)[0]
        t[key] = t[key].clone()
        t[key][0, 0] = float("nan")
    rewrite_adapter(bad, plant)
    f = finding("adapter.weights", demo.qwen_stage1, bad)
    assert f.verdict == "fail" and "NaN/inf" in f.title and f.evidence["nonfinite"][0]["nan"] == 1


def test_update_norm_is_the_frobenius_norm_of_b_times_a():
    torch.manual_seed(0)
    a, b = torch.randn(4, 32), torch.randn(16, 4)
    assert aw.update_norm(a, b) == pytest.approx(float((b @ a).norm()), rel=1e-4)


# --- adapter.targets ---------------------------------------------------------------------------------------------
def test_a_pattern_matching_nothing_and_weights_naming_missing_modules_fail(demo, copy_of, edit_json):
    nothing = copy_of(demo.qwen_stage2, "nothing")
    edit_json(nothing / "adapter_config.json", target_modules=["qkv_projection"])
    f = finding("adapter.targets", demo.qwen_stage1, nothing)
    assert f.verdict == "fail" and "matches no module" in f.title
    missing = copy_of(demo.qwen_stage2, "missing")
    rewrite_adapter(missing, lambda t: {k.replace("layers.1.", "layers.7."): v for k, v in t.items()})
    f = finding("adapter.targets", demo.qwen_stage1, missing)
    assert f.verdict == "fail" and "the base lacks" in f.title and "layers.7." in f.detail


def test_all_linear_reaching_the_vision_tower_warns(demo, copy_of, edit_json):
    wide = copy_of(demo.qwen_stage2, "all-linear")
    edit_json(wide / "adapter_config.json", target_modules="all-linear")
    f = finding("adapter.targets", demo.qwen_stage1, wide)
    assert f.verdict == "warn" and "vision-tower" in f.title
    assert f.evidence["matched_per_component"]["vision"] > 0 and "head" not in f.evidence["matched_per_component"]
    head = copy_of(demo.qwen_stage2, "head")
    edit_json(head / "adapter_config.json", target_modules=r".*language_model.*\.q_proj|lm_head")
    f = finding("adapter.targets", demo.qwen_stage1, head)
    assert f.verdict == "warn" and "output head" in f.title


def test_a_base_whose_skeleton_cannot_be_built_is_an_error_naming_its_config(demo, copy_of, edit_json):
    # an adapter on a base of custom code (model_type unknown to this transformers, auto_map declared): PEFT's
    # matching needs the base's modules, so the check cannot answer, and says why and what to pass
    base = copy_of(demo.qwen_stage1, "custom-base")
    edit_json(base / "config.json", model_type="acme_vlm", auto_map={"AutoConfig": "configuration_acme.AcmeConfig"})
    f = finding("adapter.targets", base, demo.qwen_stage2)
    assert f.verdict == "error" and f.title == "Could not match the adapter's targets on the base", f
    assert "the base's skeleton could not be built" in f.detail and f"{base}/config.json" in f.detail
    assert "model_type 'acme_vlm' is unknown to transformers" in f.detail and "auto_map" in f.detail
    assert "--trust-remote-code" in f.detail and "--trust-remote-code" in f.fix and "config.json" in f.fix
    assert f.evidence["adapter"] == str(demo.qwen_stage2) and f.evidence["target_modules"]
    assert finding("adapter.targets", demo.qwen_stage1, demo.qwen_stage2).verdict == "info"  # the untouched twin


# --- tokenizer.vocab ---------------------------------------------------------------------------------------------
def add_token(folder: Path, token: str = "<|new_tool|>") -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": [token]})
    tok.save_pretrained(folder)
    return len(tok)


def test_a_token_id_past_the_embedding_rows_fails(demo, copy_of):
    llama = copy_of(demo.llama, "llama-added")
    assert add_token(llama) == 401
    f = finding("tokenizer.vocab", llama)
    assert f.verdict == "fail" and "Token id 400 is past the embedding rows (400)" in f.title
    assert "device-side assert" in f.detail and "resize_token_embeddings" in f.fix


def test_tokens_added_in_training_without_saved_embeddings_fail(demo, copy_of):
    from transformers import AutoTokenizer

    adapter = copy_of(demo.qwen_stage2, "added")
    AutoTokenizer.from_pretrained(demo.qwen_stage1, local_files_only=True).save_pretrained(adapter)
    assert add_token(adapter) == 401
    f = finding("tokenizer.vocab", demo.qwen_stage1, adapter)
    assert f.verdict == "fail" and "tokenizer 401 tokens, base embeddings 400 rows" in f.title
    assert "modules_to_save" in f.fix


def test_tokens_added_in_training_with_the_resized_embeddings_saved_are_information(llamas, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def adapter(name: str, new_tokens: list[str]) -> Path:
        tok = AutoTokenizer.from_pretrained(llamas["untied"], local_files_only=True)
        tok.add_special_tokens({"additional_special_tokens": new_tokens})
        model = AutoModelForCausalLM.from_pretrained(llamas["untied"], local_files_only=True)
        model.resize_token_embeddings(len(tok))
        get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["embed_tokens", "lm_head"],
                                         task_type="CAUSAL_LM")).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        return tmp_path / name

    resized = adapter("resized", ["<|tool_call|>", "<|tool_result|>"])
    f = finding("tokenizer.vocab", llamas["untied"], resized)
    assert f.verdict == "info" and f.title == "The adapter saves 402 embedding rows; the base has 400", f
    assert "base must be resized the same way" in f.detail
    assert f.fix.startswith("`base.resize_token_embeddings(402)` before `PeftModel.from_pretrained(base, adapter)`")
    assert f.evidence["tokenizer_len"] == 402 and f.evidence["input_rows"] == 400 and f.evidence["tokenizer_in_adapter"]
    assert max(f.evidence["adapter_rows"].values()) == 402
    same = adapter("same-vocab", [])  # embeddings saved, none added: nothing to resize
    f = finding("tokenizer.vocab", llamas["untied"], same)
    assert f.verdict == "pass" and f.evidence["adapter_rows"], f


# --- tokenizer.special_tokens ------------------------------------------------------------------------------------
def test_pad_equal_to_eos_and_no_pad_warn(demo, copy_of, edit_json):
    same = copy_of(demo.llama, "pad-eos")
    edit_json(same / "tokenizer_config.json", pad_token="<|im_end|>")
    f = finding("tokenizer.special_tokens", same)
    assert f.verdict == "warn" and "pad = EOS" in f.title and "never learns to stop" in f.detail
    none = copy_of(demo.llama, "no-pad")
    edit_json(none / "tokenizer_config.json", pad_token=None)
    f = finding("tokenizer.special_tokens", none)
    assert f.verdict == "warn" and f.title == "No pad token"


def test_generation_eos_without_the_end_of_turn_token_fails(demo, copy_of, edit_json):
    ckpt = copy_of(demo.llama, "eos")
    edit_json(ckpt / "generation_config.json", eos_token_id=0)
    f = finding("tokenizer.special_tokens", ckpt)
    assert f.verdict == "fail" and "'<|im_end|>' (2)" in f.title and "eos_token_id = [0, 2]" in f.fix


def with_bos(folder: Path, tokenizer_adds: bool, template_writes: bool) -> None:
    from tokenizers import processors
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tok.bos_token = "<|endoftext|>"
    if tokenizer_adds:
        tok._tokenizer.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)])
    if template_writes:
        tok.chat_template = "{{ bos_token }}" + tok.chat_template
    tok.save_pretrained(folder)


def test_render_then_encode_doubling_bos_warns_and_a_template_bos_alone_passes(demo, copy_of):
    doubled = copy_of(demo.llama, "doubled")
    with_bos(doubled, tokenizer_adds=True, template_writes=True)
    f = finding("tokenizer.special_tokens", doubled)
    assert f.verdict == "warn" and "Render-then-encode doubles BOS" in f.title, f
    assert f.evidence["leading_ids"][:2] == [0, 0] and f.evidence["template_leading_ids"][:2] != [0, 0]
    once = copy_of(demo.llama, "once")  # Llama-3 style: the template writes BOS, encode adds none
    with_bos(once, tokenizer_adds=False, template_writes=True)
    f = finding("tokenizer.special_tokens", once)
    assert f.verdict == "pass" and "BOS added once" in f.detail


@pytest.mark.parametrize("layout", ["llama3", "gemma3"])
def test_the_official_llama3_and_gemma3_bos_layout_warns_and_never_fails(layout, tmp_path):
    # the template writes {{ bos_token }} and the tokenizer adds BOS too (Llama 3's post-processor, Gemma 3's
    # add_bos_token): tokenizer(rendered) doubles it, apply_chat_template(tokenize=True) (trl's path) does not
    from data_setups import bos_in_template_checkpoint
    from transformers import AutoTokenizer

    ckpt = bos_in_template_checkpoint(tmp_path / layout, layout)
    tok = AutoTokenizer.from_pretrained(ckpt)
    bos = tok.bos_token_id
    f = finding("tokenizer.special_tokens", ckpt)
    assert f.verdict == "warn" and "Render-then-encode doubles BOS" in f.title, f
    once = f.evidence["template_leading_ids"]
    assert f.evidence["leading_ids"][:2] == [bos, bos] and once[0] == bos and once[1] != bos
    assert not f.evidence["template_doubles_bos"] and f.evidence["transformers_version"]
    assert "renders then encodes" in f.detail and "data.template" in f.detail and "one BOS" in f.detail
    assert "tokenizer(text, add_special_tokens=False)" in f.fix and repr(tok.bos_token) in f.fix
    v = verdicts(ckpt)
    assert "fail" not in v.values() and v["tokenizer.vocab"] == "pass", v


# --- config.tied_embeddings --------------------------------------------------------------------------------------
def test_an_adapter_saving_lm_head_on_a_tied_model_fails(llamas, tmp_path):
    adapter = lora_adapter(llamas["tied"], tmp_path / "head", target_modules=["q_proj"], modules_to_save=["lm_head"])
    f = finding("config.tied_embeddings", llamas["tied"], adapter)
    assert f.verdict == "fail" and "ties them" in f.title and "lm_head" in f.detail
    assert "ensure_weight_tying=True" in f.fix


def test_tie_settings_that_contradict_the_tensors(llamas, copy_of, edit_json, tmp_path):
    no_head = copy_of(llamas["tied"], "no-head")
    edit_json(no_head / "config.json", tie_word_embeddings=False)
    f = finding("config.tied_embeddings", no_head)
    assert f.verdict == "fail" and "no lm_head" in f.title
    trained_head = copy_of(llamas["untied"], "trained-head")
    edit_json(trained_head / "config.json", tie_word_embeddings=True)
    f = finding("config.tied_embeddings", trained_head)
    assert f.verdict == "fail" and "differs" in f.title
    same = tiny_llama(tmp_path / "same", False, same_head=True)
    f = finding("config.tied_embeddings", same)
    assert f.verdict == "warn" and "Identical" in f.title


def t5_v1_1_as_published(folder: Path) -> Path:
    """A T5 v1.1 / Flan-T5-shaped checkpoint: config.json says tie_word_embeddings false, lm_head saved apart from
    `shared` with values of its own (transformers 5.x's T5Config ties whatever the file says)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                num_heads=4, feed_forward_proj="gated-gelu", decoder_start_token_id=0))
    model.lm_head.weight = torch.nn.Parameter(torch.randn(64, 16, generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return folder


def test_a_t5_v1_1_head_saved_apart_as_its_config_declares_passes_and_may_be_trained(copy_of, edit_json, tmp_path):
    """Held-out entry forms: mT5 and T5 v1.1 checkpoints as published (flan-t5 among them) drew a fail, and the
    callback stopped their runs: transformers 5.x's T5Config forces the tie, the meta skeleton ties the head, yet
    from_pretrained keeps a saved head that differs (modeling_utils tie_weights), as config.json declares."""
    from peft import LoraConfig, get_peft_model
    from transformers import T5ForConditionalGeneration

    published = t5_v1_1_as_published(tmp_path / "t5-v1_1")
    loaded = T5ForConditionalGeneration.from_pretrained(published)
    assert loaded.lm_head.weight is not loaded.shared.weight  # what the installed transformers makes of it
    f = finding("config.tied_embeddings", published)
    assert f.verdict == "pass" and f.evidence["kept_apart_at_load"] and f.evidence["tied_by_model"], f.detail
    assert "untied" in f.title and "keeps them apart" in f.detail
    saved_head = tmp_path / "saved-head"
    get_peft_model(loaded, LoraConfig(r=2, target_modules=["q", "v"], modules_to_save=["lm_head"],
                                      task_type="SEQ_2_SEQ_LM")).save_pretrained(saved_head)
    assert finding("config.tied_embeddings", published, saved_head).verdict == "pass"
    # the same tensors under a file that declares the tie: the config contradicts the checkpoint
    declared_tied = copy_of(published, "declared-tied")
    edit_json(declared_tied / "config.json", tie_word_embeddings=True)
    f = finding("config.tied_embeddings", declared_tied)
    assert f.verdict == "fail" and "differs" in f.title and not f.evidence["kept_apart_at_load"]


# --- config.quantization -----------------------------------------------------------------------------------------
BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_compute_dtype": "bfloat16"}


def test_a_16bit_model_declaring_4bit_fails(demo, copy_of, edit_json):
    merged = copy_of(demo.llama, "merged")
    edit_json(merged / "config.json", quantization_config=BNB_4BIT)
    f = finding("config.quantization", merged)
    assert f.verdict == "fail" and "declares bitsandbytes 4-bit" in f.title and "unsloth #1601" in f.detail


def test_quantized_weights_with_and_without_a_declaration(demo, copy_of, edit_json, tmp_path):
    quantized = copy_of(demo.llama, "quantized")
    path = quantized / "model-00001-of-00005.safetensors"
    tensors = load_file(str(path))
    weight = next(k for k in tensors if k.endswith("proj.weight"))
    tensors[weight] = torch.zeros(tensors[weight].numel() // 2, 1, dtype=torch.uint8)
    tensors[weight + ".absmax"] = torch.ones(4)
    tensors[weight + ".quant_state.bitsandbytes__nf4"] = torch.zeros(8, dtype=torch.uint8)
    save_file(tensors, str(path), metadata={"format": "pt"})
    index = json.loads((quantized / "model.safetensors.index.json").read_text())
    index["weight_map"].update({k: path.name for k in tensors})
    (quantized / "model.safetensors.index.json").write_text(json.dumps(index))
    f = finding("config.quantization", quantized)
    assert f.verdict == "fail" and "declares no quantization_config" in f.title and ".absmax" in f.detail
    edit_json(quantized / "config.json", quantization_config=BNB_4BIT)
    assert finding("config.quantization", quantized).verdict == "pass"
    adapter = lora_adapter(demo.llama, tmp_path / "on-4bit", target_modules=["q_proj"])
    f = finding("config.quantization", quantized, adapter)
    assert f.verdict == "warn" and "pre-quantized" in f.title and "merge_and_unload" in f.detail


# --- config.generation -------------------------------------------------------------------------------------------
def test_a_generation_config_save_pretrained_would_refuse_fails(demo, copy_of, edit_json):
    ckpt = copy_of(demo.llama, "greedy-with-temperature")
    edit_json(ckpt / "generation_config.json", do_sample=False, temperature=0.7)
    f = finding("config.generation", ckpt)
    assert f.verdict == "warn" and "temperature" in f.title and "#29988" in f.detail
    edit_json(ckpt / "generation_config.json", early_stopping="sometimes")  # invalid even leniently
    assert finding("config.generation", ckpt).verdict == "fail"
    (ckpt / "generation_config.json").unlink()
    assert finding("config.generation", ckpt).verdict == "skip"


# --- the notebook's steps, as the runner and the panel run them ---------------------------------------------------
def test_the_notebook_steps_report_every_check_on_the_demo(demo, tmp_path):
    import workbench as wb
    from workbench.catalog import notebook

    nb = wb.open_notebook("00_saved_files", checkpoint=str(demo.qwen_stage2),
                          findings_path=str(tmp_path / "f.json"))
    for step in notebook("00_saved_files").steps:
        nb.run(step.name)
    found = {f.id: f.verdict for f in nb.recorder.findings}
    assert set(found) == set(notebook("00_saved_files").checks)
    assert "error" not in found.values() and "fail" not in found.values() and "warn" not in found.values()
    assert "Bytes read" in nb.results["files"].view().html()


def test_a_tokenizer_that_does_not_load_is_an_error_of_the_tokenizer_checks(demo, copy_of):
    broken = copy_of(demo.llama, "broken-tokenizer")
    (broken / "tokenizer.json").write_text("{")
    v = verdicts(broken)
    assert v["tokenizer.vocab"] == v["tokenizer.special_tokens"] == "error"
    assert v["config.generation"] == "pass"  # the other checks still answer


def test_trainable_token_indices_past_the_rows_fail(demo, copy_of, edit_json):
    adapter = copy_of(demo.qwen_stage2, "trainable-tokens")
    edit_json(adapter / "adapter_config.json", trainable_token_indices=[5, 400])
    f = finding("tokenizer.vocab", demo.qwen_stage1, adapter)
    assert f.verdict == "fail" and "Token id 400" in f.title


def test_a_name_list_reaching_clips_q_proj_warns_and_an_anchored_regex_does_not(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    LlavaForConditionalGeneration(LlavaConfig(  # LLaVA #1380: the CLIP tower has q_proj / v_proj too
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=32, patch_size=8),
        text_config=LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2),
        image_token_index=255, image_seq_length=16)).save_pretrained(tmp_path / "llava")
    found = {}
    for name, targets in (("list", ["q_proj", "v_proj"]), ("regex", r".*language_model.*\.(q_proj|v_proj)")):
        model = LlavaForConditionalGeneration.from_pretrained(tmp_path / "llava")
        get_peft_model(model, LoraConfig(r=2, target_modules=targets)).save_pretrained(tmp_path / name)
        found[name] = finding("adapter.targets", tmp_path / "llava", tmp_path / name)
    assert found["list"].verdict == "warn" and "4 vision-tower module(s) (q_proj, v_proj)" in found["list"].title
    assert found["list"].evidence["matched_per_component"] == {"language": 4, "vision": 4}
    assert found["regex"].verdict == "info" and found["regex"].evidence["matched_per_component"] == {"language": 4}


@pytest.mark.parametrize("name", ["qwen2_tied", "gpt2", "t5", "gemma3_text", "bert_seq_cls", "bert_encoder", "llava",
                                  "gemma3_vlm", "mixtral"])
def test_the_saved_files_of_healthy_families_raise_nothing(family, name, tmp_path):
    # tied embeddings (Qwen2, GPT-2, T5, Gemma 3), an encoder-decoder, encoders with and without a head, VLMs, a MoE:
    # notebook 00 must stay quiet on every healthy checkpoint (no tokenizer saved: the tokenizer checks say skip)
    from workbench.catalog import notebook
    from workbench.notebook import open_notebook

    nb = open_notebook("00_saved_files", checkpoint=str(family(name)), findings_path=str(tmp_path / "f.json"))
    for step in notebook("00_saved_files").steps:
        nb.run(step.name)
    verdicts = {f.id: f.verdict for f in nb.recorder.findings}
    assert set(verdicts) == set(notebook("00_saved_files").checks)
    assert not {c: v for c, v in verdicts.items() if v in ("fail", "error", "warn")}, verdicts
    assert verdicts["tokenizer.vocab"] == verdicts["tokenizer.special_tokens"] == "skip"
    assert verdicts["adapter.weights"] == verdicts["adapter.targets"] == "skip"  # a full checkpoint: no adapter


# --- config.tied_embeddings asks the model as transformers builds it, not the top-level flag ---------------------
def tiny_cpmant(folder: Path) -> Path:
    from transformers import CpmAntConfig, CpmAntForCausalLM

    torch.manual_seed(0)
    # CpmAntForCausalLM._tied_weights_keys = {}: its head is saved apart although tie_word_embeddings defaults to true
    CpmAntForCausalLM(CpmAntConfig(vocab_size=120, hidden_size=32, num_attention_heads=2, dim_head=16, dim_ff=64,
                                   num_hidden_layers=1, prompt_length=4, prompt_types=2)).save_pretrained(folder)
    return folder


def tiny_vision_encoder_decoder(folder: Path) -> Path:
    from transformers import BertConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

    torch.manual_seed(0)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=16),
        BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    # the composite's top-level tie_word_embeddings is false; the BERT decoder's own config ties its head
    VisionEncoderDecoderModel(config).save_pretrained(folder)
    return folder


def test_a_class_that_ties_nothing_under_a_tied_flag_passes_and_fails_without_its_head(copy_of, tmp_path):
    healthy = tiny_cpmant(tmp_path / "cpmant")
    assert json.loads((healthy / "config.json").read_text())["tie_word_embeddings"] is True
    f = finding("config.tied_embeddings", healthy)
    assert f.verdict == "pass" and f.evidence["tied_by_model"] is False and "CpmAntForCausalLM" in f.detail
    headless = copy_of(healthy, "headless")
    rewrite = {k: v for k, v in load_file(str(headless / "model.safetensors")).items() if k != "lm_head.weight"}
    save_file(rewrite, str(headless / "model.safetensors"), metadata={"format": "pt"})
    f = finding("config.tied_embeddings", headless)
    assert f.verdict == "fail" and "no lm_head" in f.title and "CpmAntForCausalLM ties no head" in f.detail
    assert "tie_word_embeddings" not in f.fix  # the flag is already true: setting it changes nothing here


def test_an_encoder_decoder_tied_by_its_decoder_config_passes_and_fails_once_the_decoder_unties(copy_of, edit_json,
                                                                                               tmp_path):
    healthy = tiny_vision_encoder_decoder(tmp_path / "ved")
    f = finding("config.tied_embeddings", healthy)
    assert f.verdict == "pass" and f.evidence["tied_by_model"] is True
    assert f.evidence["tie_word_embeddings"] is False and f.evidence["output_tensor"] is None
    untied = copy_of(healthy, "untied-decoder")
    decoder = json.loads((untied / "config.json").read_text())["decoder"]
    edit_json(untied / "config.json", decoder={**decoder, "tie_word_embeddings": False})
    f = finding("config.tied_embeddings", untied)
    assert f.verdict == "fail" and "decoder.cls.predictions.decoder" in f.title


# --- config.tied_embeddings follows the head's own tie, not get_input_embeddings() ------------------------------
def tiny_t5gemma(folder: Path) -> Path:
    from transformers import T5GemmaConfig, T5GemmaForConditionalGeneration, T5GemmaModuleConfig

    torch.manual_seed(0)
    module = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}
    # _tied_weights_keys ties lm_head.out_proj to model.decoder.embed_tokens; get_input_embeddings() is the encoder's
    T5GemmaForConditionalGeneration(T5GemmaConfig(encoder=T5GemmaModuleConfig(**module),
                                                  decoder=T5GemmaModuleConfig(**module))).save_pretrained(folder)
    return folder


def tiny_bert_encoder_decoder(folder: Path) -> Path:
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    torch.manual_seed(0)
    bert = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32}
    config = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(**bert), BertConfig(**bert))
    # the BERT decoder's own config ties decoder.cls.predictions.decoder to its own word embeddings, not the encoder's
    EncoderDecoderModel(config).save_pretrained(folder)
    return folder


def with_saved_head(folder: Path, head: str) -> None:
    """Write the head tensor into the file, trained apart (values unlike every embedding)."""
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[head] = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("build, head, tied_to", [
    (tiny_t5gemma, "lm_head.out_proj", "model.decoder.embed_tokens"),
    (tiny_bert_encoder_decoder, "decoder.cls.predictions.decoder", "decoder.bert.embeddings.word_embeddings")])
def test_a_head_tied_to_the_decoders_embeddings_passes_without_its_key_and_fails_once_it_differs(
        build, head, tied_to, copy_of, tmp_path):
    healthy = build(tmp_path / "healthy")
    f = finding("config.tied_embeddings", healthy)
    assert f.verdict == "pass" and f.evidence["tied_by_model"] is True
    assert f.evidence["output_tensor"] is None and f.evidence["input_tensor"] == f"{tied_to}.weight"
    differs = copy_of(healthy, "head-differs")
    with_saved_head(differs, f"{head}.weight")
    f = finding("config.tied_embeddings", differs)
    assert f.verdict == "fail" and "differs" in f.title and f"{tied_to}.weight" in f.detail


def test_an_untied_t5gemma_without_its_head_fails(copy_of, edit_json, tmp_path):
    untied = copy_of(tiny_t5gemma(tmp_path / "t5gemma"), "untied")
    edit_json(untied / "config.json", tie_word_embeddings=False)  # T5GemmaForConditionalGeneration reads this flag
    f = finding("config.tied_embeddings", untied)
    assert f.verdict == "fail" and "no lm_head.out_proj" in f.title and f.evidence["tied_by_model"] is False


def test_an_untied_bert_decoder_without_its_head_fails(copy_of, edit_json, tmp_path):
    untied = copy_of(tiny_bert_encoder_decoder(tmp_path / "bert2bert"), "untied-decoder")
    decoder = json.loads((untied / "config.json").read_text())["decoder"]
    edit_json(untied / "config.json", decoder={**decoder, "tie_word_embeddings": False})
    f = finding("config.tied_embeddings", untied)
    assert f.verdict == "fail" and "no decoder.cls.predictions.decoder" in f.title
