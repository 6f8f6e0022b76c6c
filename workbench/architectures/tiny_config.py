"""A tiny config of any architecture, by shrinking its config class's own defaults — never a config per family.

    config = tiny_config(CONFIG_MAPPING["deepseek_v3"])   # 2 layers, width 64, 4 heads, 4 experts, MLA ranks 16

Every size-like field is found by its name at every level of the config (text, vision, audio sub-configs alike)
and set to one small value, so that the sizes that must agree across sub-configs (a projector's input = the
vision width, PaliGemma's `projection_dim` = the text width) still agree. What is derived from the sizes is
rescaled the way the config derives it: per-layer lists cut to the new depth, M-RoPE sections summing to half the
new head dim. The vocabulary shrinks to 256 unless a special token id of the config needs more.
"""

from __future__ import annotations

from typing import Any

WIDTH = 64
FFN = 128
LAYERS = 2
HEADS = 4
HEAD_DIM = WIDTH // HEADS
VOCAB = 256

# field name -> its tiny value; a field is matched by name at every level of the config
SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim", "projection_dim",
                     "pooler_hidden_size", "word_embed_proj_dim", "out_hidden_size", "d_embed", "n_embed",
                     "embedding_size", "text_hidden_size", "vision_hidden_size", "mm_hidden_size",
                     "projector_hidden_size", "hidden_dim_text", "output_dim"), WIDTH),
    **dict.fromkeys(("intermediate_size", "d_ff", "ffn_dim", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
                     "ffn_hidden_size", "hidden_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "projector_intermediate_size", "text_intermediate_size"), FFN),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "depth", "num_decoder_layers", "num_encoder_layers", "text_layers", "vision_layers"), LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "n_heads"), HEADS),
    **dict.fromkeys(("head_dim", "attention_head_dim", "v_head_dim", "qk_nope_head_dim", "kv_channels"), HEAD_DIM),
    **dict.fromkeys(("qk_rope_head_dim", "rotary_dim"), 8),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "num_selected_experts"), 2),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "n_group", "topk_group", "first_k_dense_replace"), 1),
}
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "depth")
TOKEN_ID_SUFFIXES = ("token_id", "token_index", "token_ids")


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _own_fields(config) -> dict[str, Any]:
    """The config's own fields, sub-configs left out (they are shrunk on their own)."""
    return {k: v for k, v in vars(config).items() if not k.startswith("_") and not _is_config(v)}


def _token_ids(config) -> list[int]:
    """Every special token id the config names, at every level."""
    out: list[int] = []
    for key, value in _own_fields(config).items():
        if key.endswith(TOKEN_ID_SUFFIXES):
            values = value if isinstance(value, (list, tuple)) else [value]
            out += [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    for value in vars(config).values():
        if _is_config(value):
            out += _token_ids(value)
    return out


def _kv_heads(original: int, heads: int | None) -> int:
    if original == 1:
        return 1  # multi-query attention stays multi-query
    if heads is not None and original == heads:
        return HEADS
    return 2


def _rope_sections(value: Any, head_dim: int) -> Any:
    """M-RoPE sections (Qwen2-VL's [16, 24, 24] over head_dim 128) rescaled to sum to half the new head dim."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key in ("mrope_section", "mrope_sections"):
        sections = out.get(key)
        if isinstance(sections, list) and sections and sum(sections):
            half = head_dim // 2
            scaled = [max(1, s * half // sum(sections)) for s in sections]
            scaled[-1] += half - sum(scaled)
            out[key] = scaled
    return out


def shrunk_fields(config, vocab: int) -> dict[str, Any]:
    """The keyword arguments that shrink this config (sub-configs as dicts of theirs, with their model_type)."""
    fields = _own_fields(config)
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key in SIZES and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[key] = min(value, SIZES[key])
        elif key == "depths" and isinstance(value, list) and all(isinstance(v, int) for v in value):
            out[key] = [1] * len(value)
    if "qk_rope_head_dim" in out and "head_dim" in out:  # MLA: the rotary part is what head_dim sizes
        out["head_dim"] = out["qk_rope_head_dim"]
    heads = out.get("num_attention_heads", fields.get("num_attention_heads"))
    for key in KV_HEADS:
        if isinstance(fields.get(key), int) and fields[key] > 0:
            out[key] = _kv_heads(fields[key], fields.get("num_attention_heads"))
    if isinstance(fields.get("vocab_size"), int) and fields["vocab_size"] > vocab:
        out["vocab_size"] = vocab
    depth = next((fields[k] for k in LAYER_COUNTS if isinstance(fields.get(k), int)), None)
    new_depth = next((out[k] for k in LAYER_COUNTS if k in out), None)
    for key, value in fields.items():  # per-layer lists (layer_types, ...) follow the new depth
        if depth and new_depth and isinstance(value, list) and len(value) == depth and key not in out:
            out[key] = value[:new_depth]
    head_dim = out.get("head_dim") or (out.get("hidden_size", WIDTH) // (heads or HEADS))
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(fields.get(key), dict):
            rope = fields[key]
            if "mrope_section" in getattr(type(config), "ignore_keys_at_rope_validation", ()) and \
                    "mrope_section" not in rope:  # the modeling code's default split, [16, 24, 24] of head_dim 128
                rope = {**rope, "mrope_section": [16, 24, 24]}
            scaled = _rope_sections(rope, head_dim)
            if scaled != fields[key]:
                out[key] = scaled
    for key, value in vars(config).items():
        if _is_config(value) and not key.startswith("_"):
            out[key] = {"model_type": value.model_type, **shrunk_fields(value, vocab)}
    return out


def tiny_config(config_class, **overrides: Any):
    """The config class's defaults, every size shrunk (module docstring); `overrides` go on top."""
    default = config_class()
    ids = _token_ids(default)
    vocab = max([VOCAB, *[i + 1 for i in ids]])
    return config_class(**{**shrunk_fields(default, vocab), **overrides})
