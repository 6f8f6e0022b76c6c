"""run.adapter_progress on real LoRA runs: a tiny Llama, PEFT's get_peft_model, a few real AdamW steps between
save_pretrained calls into checkpoint-N/ folders. Planted: reentrant gradient checkpointing without input grads
(the layers' adapters never move, lm_head's does), a NaN injected into the loss mid-run, a learning rate dropped
to 0 (the adapter stops moving); the healthy twin moves at every save."""

from pathlib import Path

import pytest
import torch

from workbench.probes.run.adapter_progress import adapter_progress_probe


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config)


def lora_run(out: Path, steps=(2, 4, 6), targets=("q_proj", "v_proj"), reentrant=False, nan_at=None,
             lr_zero_after=None) -> Path:
    """Train a LoRA with real optimizer steps, saving the adapter to out/checkpoint-N at each step in `steps`."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, lora_alpha=4, target_modules=list(targets)))
    if reentrant:
        base = model.base_model.model
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        # transformers 5.x enables input grads here; releases and set-ups that did not left the embeddings' output
        # frozen (trl #835): undo it to run that mechanism
        base.disable_input_require_grads()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    for step in range(1, max(steps) + 1):
        if lr_zero_after is not None and step > lr_zero_after:
            for group in opt.param_groups:
                group["lr"] = 0.0
        loss = model(input_ids=batch, labels=batch).loss
        if nan_at is not None and step == nan_at:
            loss = loss * float("nan")
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step in steps:
            model.save_pretrained(out / f"checkpoint-{step}")
    return out


def only(result):
    [f] = result.findings()
    assert f.id == "run.adapter_progress"
    return f


def test_a_healthy_run_moves_at_every_checkpoint(tmp_path):
    result = adapter_progress_probe(lora_run(tmp_path / "healthy"))
    f = only(result)
    assert f.verdict == "pass" and "moved across 3 checkpoint(s)" in f.title, f
    assert [c["step"] for c in f.evidence["checkpoints"]] == [2, 4, 6]
    norms = [c["update_norm_per_component"]["q_proj"] for c in f.evidence["checkpoints"]]
    assert 0 < norms[0] < norms[-1]
    assert "q_proj" in f.detail and "v_proj" in f.detail
    assert "update norm per component" in str(result)


def test_reentrant_checkpointing_without_input_grads_leaves_the_layers_still(tmp_path):
    # lm_head sits outside the checkpointed decoder layers: it trains, the layers' q_proj / v_proj never do
    run = lora_run(tmp_path / "reentrant", targets=("q_proj", "v_proj", "lm_head"), reentrant=True)
    f = only(adapter_progress_probe(run))
    assert f.verdict == "warn" and "never moved in any checkpoint" in f.title, f
    assert "q_proj" in f.title and "v_proj" in f.title and "lm_head" not in f.title
    assert all(".layers." in m for m in f.evidence["never_moved"]) and len(f.evidence["never_moved"]) == 4
    assert "use_reentrant" in f.fix and "trl #835" in f.detail
    # the healthy twin: the same targets without checkpointing all move
    twin = only(adapter_progress_probe(lora_run(tmp_path / "twin", targets=("q_proj", "v_proj", "lm_head"))))
    assert twin.verdict == "pass" and "never moved" not in twin.title


def test_nan_from_a_checkpoint_on_fails_and_names_the_checkpoint_to_resume_from(tmp_path):
    f = only(adapter_progress_probe(lora_run(tmp_path / "nan", nan_at=5)))
    assert f.verdict == "fail" and "from checkpoint-6 on" in f.title, f
    assert f.evidence["first_nonfinite_step"] == 6
    assert "checkpoint-4" in f.fix and "resume_from_checkpoint" in f.fix


def test_an_adapter_that_stops_moving_warns(tmp_path):
    f = only(adapter_progress_probe(lora_run(tmp_path / "stopped", steps=(2, 4, 6, 8), lr_zero_after=4)))
    assert f.verdict == "warn" and "stopped moving after checkpoint-4" in f.title, f
    assert f.evidence["unchanged"] == [[4, 6], [6, 8]]


def test_single_checkpoint_folder_and_components_from_the_caller(tmp_path):
    run = lora_run(tmp_path / "one", steps=(3,))
    result = adapter_progress_probe(run / "checkpoint-3", component_of=lambda m: "language")
    f = only(result)
    assert f.verdict == "pass" and f.evidence["checkpoints"][0]["step"] == 3
    assert list(f.evidence["checkpoints"][0]["update_norm_per_component"]) == ["language"]


@pytest.mark.parametrize("content", [None, "model.safetensors"])
def test_no_adapter_skips(tmp_path, content):
    (tmp_path / "checkpoint-5").mkdir()
    if content:
        (tmp_path / "checkpoint-5" / content).write_bytes(b"")
    f = only(adapter_progress_probe(tmp_path))
    assert f.verdict == "skip"
