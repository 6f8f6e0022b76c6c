"""Verdicts of the census that are real incompatibilities of the stack, not false alarms: kept as data, each with
the release it was seen on, the source line and the upstream issue.

    known_incompatibility("deberta-v2", "qlora")   # -> the reason, or None
"""

from __future__ import annotations

KNOWN: dict[tuple[str, str], str] = {
    ("deberta-v2", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): under bf16 autocast DeBERTa-v2's "
        "DisentangledSelfAttention fills the bf16 attention scores with torch.finfo(query_layer.dtype).min "
        "(modeling_deberta_v2.py, `attention_scores.masked_fill(~(attention_mask), torch.finfo(query_layer.dtype)"
        ".min)`), and query_layer is fp32 because bitsandbytes' Linear4bit returns its input's dtype after "
        "prepare_model_for_kbit_training's fp32 upcast: 'value cannot be converted to type c10::BFloat16 without "
        "overflow' (the same dtype assumption as transformers #35332). forward.scenarios names it; train without "
        "autocast or keep DeBERTa-v2 unquantized"),
}


def known_incompatibility(model_type: str, setup: str) -> str | None:
    return KNOWN.get((model_type, setup))
