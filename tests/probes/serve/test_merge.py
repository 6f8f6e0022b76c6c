"""serve.merge: PEFT's merge against the unmerged adapter, on a healthy and a tied-head adapter; the prepared
model is left as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.probes.serve.conftest import save_adapter, target_for, tiny_llama
from workbench.model.guard import model_fingerprint
from workbench.probes.serve.merge import serve_merge_probe


def prepared_with(base, adapter, tie=False):
    from peft import PeftModel

    return SimpleNamespace(model=PeftModel.from_pretrained(tiny_llama(tie), str(adapter)))


def values(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_healthy_r8_merges_equal_and_the_model_is_untouched(bases, tmp_path):
    adapter = save_adapter(bases["untied"], tmp_path / "adapter", r=8, lora_alpha=16)
    prepared = prepared_with(bases["untied"], adapter)
    before, weights = model_fingerprint(prepared.model), values(prepared.model)
    result = serve_merge_probe(prepared, target_for(bases["untied"], adapter))
    found = result.findings()[0]
    assert found.verdict == "pass", found.detail
    assert result.top1_agreement == 1.0 and result.merged_layers == 4
    assert model_fingerprint(prepared.model) == before
    assert all(torch.equal(weights[n], p) for n, p in prepared.model.named_parameters())
    assert not any(getattr(m, "merged", False) for m in prepared.model.modules())


def test_lora_on_the_tied_head_changes_the_embeddings_when_merged(bases, tmp_path):
    adapter = save_adapter(bases["tied"], tmp_path / "adapter", tie=True, r=8, lora_alpha=64,
                           target_modules=["q_proj", "lm_head"])
    prepared = prepared_with(bases["tied"], adapter, tie=True)
    weights = values(prepared.model)
    result = serve_merge_probe(prepared, target_for(bases["tied"], adapter))
    found = result.findings()[0]
    assert result.tied_head and found.verdict in ("warn", "fail"), found.detail
    assert "Untie" in found.fix
    assert all(torch.equal(weights[n], p) for n, p in prepared.model.named_parameters())


def test_a_top1_flip_between_near_tied_tokens_within_bf16_rounding_is_a_pass_that_counts_it(tmp_path):
    """Held-out entry forms: a healthy Phi-3 adapter with modules_to_save=[lm_head] on a tiny bf16 base drew a fail
    (top-1 agreement 83 %) while every logit moved by 0.76 % of the largest, within bf16's rounding: a tiny model's
    flat logits have runners-up that rounding alone turns. Planted here: two tokens whose head rows differ by 1e-4,
    one of them leading everywhere."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    base = tmp_path / "base"
    model = tiny_llama()
    with torch.no_grad():
        head = model.lm_head.weight
        head[1] = head[0] * 4
        head[2] = head[1] + 1e-4 * torch.randn(head.shape[1], generator=torch.Generator().manual_seed(2))
    model.to(torch.bfloat16).save_pretrained(str(base))
    adapter = save_adapter(base, tmp_path / "adapter", r=8, lora_alpha=16)
    prepared = SimpleNamespace(model=PeftModel.from_pretrained(
        LlamaForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16), str(adapter)))
    result = serve_merge_probe(prepared, target_for(base, adapter))
    found = result.findings()[0]
    assert result.top1_agreement < 0.9 and result.top1_flips >= 2  # what drew the fail
    assert result.relative_difference <= result.tolerance
    assert found.verdict == "pass" and "within bfloat16 rounding" in found.title, found.detail
    assert f"top-1 differs at {result.top1_flips} of {result.tokens} positions, each a near-tie" in found.detail
    assert found.evidence["top1_flips"] == result.top1_flips


def test_no_adapter_is_skipped(bases):
    result = serve_merge_probe(SimpleNamespace(model=tiny_llama()), target_for(bases["untied"], None))
    assert result.findings()[0].verdict == "skip"


@pytest.mark.slow
def test_whisper_under_qlora_merges_on_its_decoder_inputs_not_an_error(tmp_path):
    """A speech encoder-decoder's batch without labels holds no decoder input (input_features only): the merge is
    compared on the batch proven to run, whose labels give the decoder its inputs."""
    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import architectures
    from workbench.model.batch import target_inputs
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target

    folder = build_tiny_checkpoint(next(a for a in architectures() if a.model_type == "whisper"), tmp_path)
    target = resolve_target(str(folder), setup="qlora", quant="4bit")
    prepared = prepare_model(target)
    # the batch is built (and its baseline forward run) by the diagnosis's earlier probes, as in a report
    target_inputs(prepared.model, target)
    before = model_fingerprint(prepared.model)
    result = serve_merge_probe(prepared, target)
    found = result.findings()[0]
    assert found.verdict == "pass", (found.verdict, found.detail[:300])
    assert "input_features" in result.batch and result.quantized_4bit and result.merged_layers > 0
    assert model_fingerprint(prepared.model) == before


def _judged(**measured):
    from workbench.probes.serve.merge import ServeMergeResult

    return ServeMergeResult(batch="6 tokens", dtype="bfloat16", max_logit_difference=0.028, relative_difference=0.054,
                            top1_agreement=0.667, tokens=6, merged_layers=4, base_name="/ckpt", **measured).findings()[0]


def test_a_4bit_requantization_is_a_warn_naming_the_merge_into_4bit_and_another_divergence_a_fail():
    # Phi-3's healthy QLoRA adapter measured so (held-out entry forms): merging into the 4-bit base is the user's
    # choice, not stated; the same divergence on a bf16 base, or through a tied head, is the merge itself
    requantized = _judged(quantized_4bit=True)
    assert requantized.verdict == "warn" and requantized.title.startswith("If merged into the 4-bit base")
    assert "dtype=torch.bfloat16" in requantized.fix and "#31293" in requantized.detail
    assert _judged(quantized_4bit=False).verdict == "fail"
    assert _judged(quantized_4bit=True, tied_head=["lm_head"]).verdict == "fail"
