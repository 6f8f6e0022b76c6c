"""Tiny Llama bases and PEFT-built adapters for the serve.* checks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


def tiny_llama(tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    return LlamaForCausalLM(config).eval()


def save_adapter(base_dir: Path, out: Path, tie: bool = False, train: bool = True, **lora) -> Path:
    """An adapter as PEFT saves it, lora_B moved off zero (as after training)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(tie), LoraConfig(**{"target_modules": ["q_proj", "v_proj"], **lora}))
    if train:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name or "lora_embedding_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(str(out))
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(base_dir)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-bases")
    out = {}
    for tie in (False, True):
        folder = root / ("tied" if tie else "untied")
        tiny_llama(tie).save_pretrained(str(folder))
        out["tied" if tie else "untied"] = folder
    return out


def target_for(base: Path, adapter: Path | None) -> SimpleNamespace:
    return SimpleNamespace(adapter_dir=adapter, model_dir=base, base=str(base), params={})
