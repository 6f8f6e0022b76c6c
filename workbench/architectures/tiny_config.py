"""A tiny config of any architecture, by shrinking its config class's own defaults — never a config per family.

    config = tiny_config(CONFIG_MAPPING["deepseek_v3"])   # 2 layers, width 64, 4 heads, 4 experts, MLA ranks 16

Every size-like field is found by its name at every level of the config (text, vision, audio sub-configs alike)
and set to one small value, so that the sizes that must agree across sub-configs (a projector's input = the
vision width, PaliGemma's `projection_dim` = the text width) still agree. A field that names a size through the
class's `attribute_map` (Ernie's `moe_k` for `num_experts_per_tok`) is shrunk as that size. What is derived from
the sizes is rescaled the way the config derives it: per-layer lists cut to the new depth with every kind of layer
kept (a hybrid keeps an attention layer), M-RoPE sections summing to half the new rotary dim (the modeling code's
own default split made explicit where the config names none), lists of sizes that split the hidden width split
the tiny one. Sizes a published checkpoint always carries but the class leaves None (`head_dim`, the key-value
heads, experts per token), an encoder-decoder's `decoder_start_token_id` and a VLM's image token id get the value
the config documents or the checkpoints carry (`filled_fields`, `image_token_fill`). The vocabulary shrinks to
256 unless a special token id of the config needs more.
"""

from __future__ import annotations

import re
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
                     "projector_intermediate_size", "text_intermediate_size", "mlp_dim"), FFN),
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
    # a latent array's width, length, depth and heads (Perceiver: 1280 x 256 latents through 26 self-attentions by
    # default, the largest model of the census by far: minutes a record on a CPU without bf16 matmul kernels)
    "d_latents": WIDTH, "num_latents": 16, "num_self_attends_per_block": LAYERS,
    **dict.fromkeys(("num_self_attention_heads", "num_cross_attention_heads"), HEADS),
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


def config_token_ids(config) -> list[int]:
    """Every special token id the config names, at every level."""
    out: list[int] = []
    for key, value in _own_fields(config).items():
        if key.endswith(TOKEN_ID_SUFFIXES):
            values = value if isinstance(value, (list, tuple)) else [value]
            out += [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    for value in vars(config).values():
        if _is_config(value):
            out += config_token_ids(value)
    return out


def _kv_heads(original: int, heads: int | None, new_heads: int | None) -> int:
    """Key-value heads for `new_heads` query heads (`heads` before shrinking): multi-query stays multi-query,
    multi-head stays multi-head (as many as the query heads: a config already under HEADS keeps its own), grouped
    becomes two groups."""
    if original == 1:
        return 1  # multi-query attention stays multi-query
    if heads is not None and original == heads:
        return new_heads or HEADS
    return 2


def _rope_sections(value: Any, head_dim: int, partial: float = 1.0) -> Any:
    """M-RoPE sections (Qwen2-VL's [16, 24, 24] over head_dim 128) rescaled to sum to half the new rotary dim
    (head_dim x partial_rotary_factor: GLM-4V rotates half of each head)."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    partial = float(out.get("partial_rotary_factor", partial) or 1.0)
    for key in ("mrope_section", "mrope_sections"):
        sections = out.get(key)
        if isinstance(sections, list) and sections and sum(sections):
            half = int(head_dim * partial) // 2
            scaled = [max(1, s * half // sum(sections)) for s in sections]
            scaled[-1] = max(1, scaled[-1] + half - sum(scaled))  # no empty section when half < len(sections)
            out[key] = scaled
    return out


MROPE_DEFAULT = re.compile(r"""\.get\(\s*["']mrope_section["']\s*,\s*\[([\d,\s]+)\]\s*\)""")


def modeling_mrope_default(config) -> list[int] | None:
    """The M-RoPE split the modeling code falls back to when the rope parameters name none, read from the source of
    the config's modeling module (GLM-4V: `config.rope_parameters.get("mrope_section", [8, 12, 12])`); None when
    the module reads no such default."""
    import importlib
    import inspect

    module = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return None
    found = MROPE_DEFAULT.search(source)
    return [int(v) for v in found.group(1).split(",") if v.strip()] if found else None


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk", "num_selected_experts")


def per_layer_cut(value: list, depth: int) -> list:
    """The first `depth` entries of a per-layer list, keeping every kind of layer the full list has: a kind the cut
    would lose takes the place of a repeated one, from the end (Qwen3.5's [linear x 3, full] x 8 at depth 2 is
    [linear, full]; its rope index and cache need the attention layer every published checkpoint has). With more
    kinds than layers, the first kinds are kept (LFM3's conv, full, sliding at depth 2: conv, full)."""
    cut = list(value[:depth])
    if not all(isinstance(v, str) for v in value):
        return cut
    for kind in [k for k in dict.fromkeys(value) if k not in cut]:  # in order of first appearance
        repeated = [i for i, v in enumerate(cut) if cut.count(v) > 1]
        if not repeated:
            break  # more kinds than layers: the first ones are kept
        cut[repeated[-1]] = kind
    return cut


def filled_fields(config, shrunk: dict[str, Any]) -> dict[str, Any]:
    """Fields the class leaves None that every published checkpoint carries and the modeling code reads as numbers,
    each given the value its config documents as the derived default:
    - `head_dim` None: hidden_size // num_attention_heads (Ministral, HunYuan build `head_dim ** -0.5` from it);
    - key-value heads None: num_attention_heads, multi-head attention (Nemotron divides by it);
    - experts per token None (or above the shrunk expert count) beside routed experts: two (DeepSeek-V2's topk);
    - an encoder-decoder without `decoder_start_token_id`: its `pad_token_id`, what T5-style checkpoints carry and
      what their `_shift_right` asks for ("In T5 it is usually set to the pad_token_id"); a composite's from its
      decoder (`_decoder_start`)."""
    fields = {**_own_fields(config), **shrunk}
    out: dict[str, Any] = {}

    def number(key: str) -> int | None:
        value = fields.get(_alias(config, key), fields.get(key))
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    heads, width = number("num_attention_heads"), number("hidden_size")
    if "head_dim" in fields and fields["head_dim"] is None and heads and width:
        out["head_dim"] = width // heads
    for key in KV_HEADS:
        if key in fields and fields[key] is None and heads:
            out[key] = heads
    experts = next((number(k) for k in EXPERT_COUNTS if number(k)), None)
    for key in EXPERTS_PER_TOKEN:
        field = _alias(config, key)
        if experts and field in fields and (number(key) is None or number(key) > experts):
            out[field] = min(2, experts)
    if getattr(config, "is_encoder_decoder", False):
        out.update(_decoder_start(config, fields))
    return out


def _decoder_start(config, fields: dict[str, Any]) -> dict[str, Any]:
    """`decoder_start_token_id` (and `pad_token_id`) of an encoder-decoder that leaves them None, which its
    labels-to-decoder-inputs shift needs. A config of its own starts from its pad id (what T5-style checkpoints
    carry; for others, a stand-in that lets the shift run); a composite (EncoderDecoderConfig and its speech / vision kin) takes its
    decoder's ids, as its docs have users set them (`model.config.decoder_start_token_id = tokenizer.cls_token_id`,
    `pad_token_id = tokenizer.pad_token_id`): the decoder's bos, else its pad."""
    decoder = getattr(config, "decoder", None)
    decoder = decoder if _is_config(decoder) else None

    def own_id(source, name: str) -> int | None:
        value = getattr(source, name, None) if source is not None else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    out: dict[str, Any] = {}
    pad = fields.get("pad_token_id") if isinstance(fields.get("pad_token_id"), int) else own_id(decoder, "pad_token_id")
    if pad is not None and not isinstance(fields.get("pad_token_id"), int):
        out["pad_token_id"] = pad
    if getattr(config, "decoder_start_token_id", None) is None:
        start = own_id(decoder, "bos_token_id") if decoder is not None else None
        start = start if start is not None else pad
        if start is not None:
            out["decoder_start_token_id"] = start
    return out


def _alias(config, name: str) -> str:
    """The field behind a canonical name in the class's attribute_map (Ernie's `moe_k` for num_experts_per_tok)."""
    return (getattr(type(config), "attribute_map", None) or {}).get(name, name)


def width_splits(fields: dict[str, Any], shrunk: dict[str, Any]) -> dict[str, Any]:
    """Lists of sizes that split the hidden width (Reformer's `axial_pos_embds_dim` (64, 192) of hidden 256, which
    its embeddings concatenate), rescaled in proportion to split the tiny width."""
    width, tiny = fields.get("hidden_size"), shrunk.get("hidden_size")
    if not isinstance(width, int) or not isinstance(tiny, int) or width == tiny:
        return {}
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, (list, tuple)) and len(value) > 1 and key not in shrunk and \
                all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value) and sum(value) == width:
            scaled = [max(1, v * tiny // width) for v in value]
            scaled[-1] += tiny - sum(scaled)
            out[key] = type(value)(scaled)
    return out


def _size_name(config, key: str) -> str:
    """The size a field stands for: its own name, or the name the class's attribute_map gives it."""
    aliases = {field: name for name, field in (getattr(type(config), "attribute_map", None) or {}).items()}
    return key if key in SIZES else aliases.get(key, key)


def shrunk_fields(config, vocab: int, keep_layer_kinds: bool = True) -> dict[str, Any]:
    """The keyword arguments that shrink this config (sub-configs as dicts of theirs, with their model_type);
    per-layer lists keep every kind of layer (`per_layer_cut`) unless `keep_layer_kinds` is False (the prefix)."""
    fields = _own_fields(config)
    out: dict[str, Any] = {}
    for key, value in fields.items():
        size = _size_name(config, key)
        if size in SIZES and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[key] = min(value, SIZES[size])
        elif key == "depths" and isinstance(value, list) and all(isinstance(v, int) for v in value):
            out[key] = [1] * len(value)
    if "qk_rope_head_dim" in out and "head_dim" in out:  # MLA: the rotary part is what head_dim sizes
        out["head_dim"] = out["qk_rope_head_dim"]
    heads = out.get("num_attention_heads", fields.get("num_attention_heads"))
    for key in KV_HEADS:
        if isinstance(fields.get(key), int) and fields[key] > 0:
            out[key] = _kv_heads(fields[key], fields.get("num_attention_heads"), heads)
    if isinstance(fields.get("vocab_size"), int) and fields["vocab_size"] > vocab:
        out["vocab_size"] = vocab
    # a decoder vocabulary of its own (Marian's `decoder_vocab_size`: the size of lm_head and final_logits_bias, and
    # of the view its loss takes of the logits, modeling_marian.py) shrinks with it, or the head and the loss disagree
    if isinstance(fields.get("decoder_vocab_size"), int) and fields["decoder_vocab_size"] > vocab:
        out["decoder_vocab_size"] = vocab
    depth = next((fields[k] for k in LAYER_COUNTS if isinstance(fields.get(k), int)), None)
    new_depth = next((out[k] for k in LAYER_COUNTS if k in out), None)
    out.update(width_splits(fields, out))
    for key, value in fields.items():  # per-layer lists (layer_types, ...) follow the new depth
        if depth and new_depth and isinstance(value, list) and len(value) == depth and key not in out:
            out[key] = per_layer_cut(value, new_depth) if keep_layer_kinds else value[:new_depth]
    out.update(filled_fields(config, out))
    head_dim = out.get("head_dim") or (out.get("hidden_size", WIDTH) // (heads or HEADS))
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(fields.get(key), dict):
            rope = fields[key]
            if rope and "mrope_section" not in rope and "vocab_size" in fields:  # a text config: M-RoPE rotates
                # text positions; the split the modeling code falls back to is made explicit
                split = modeling_mrope_default(config)
                if split is None and "mrope_section" in getattr(type(config), "ignore_keys_at_rope_validation", ()):
                    split = [16, 24, 24]  # Qwen2-VL's split of head_dim 128, the M-RoPE families' common default
                rope = {**rope, "mrope_section": split} if split else rope
            scaled = _rope_sections(rope, head_dim, float(fields.get("partial_rotary_factor") or 1.0))
            if scaled != fields[key]:
                out[key] = scaled
    for key, value in vars(config).items():
        if _is_config(value) and not key.startswith("_"):
            out[key] = {"model_type": value.model_type, **shrunk_fields(value, vocab, keep_layer_kinds)}
    return out


def tiny_config(config_class, keep_layer_kinds: bool = True, **overrides: Any):
    """The config class's defaults, every size shrunk (module docstring); `overrides` go on top."""
    default = config_class()
    ids = config_token_ids(default)
    vocab = max([VOCAB, *[i + 1 for i in ids]])
    fields = shrunk_fields(default, vocab, keep_layer_kinds)
    config = config_class(**{**fields, **image_token_fill(default, fields, ids), **overrides})
    return composite_decoder_attends(config)


def composite_decoder_attends(config):
    """A composite encoder-decoder (EncoderDecoderConfig and its vision / speech kin) with its decoder set as every
    checkpoint of it has one: the class's own `from_encoder_decoder_configs` sets `is_decoder` and
    `add_cross_attention` on the decoder config (the bare defaults leave a BERT decoder without cross-attention, so
    the encoder's output never reaches the loss)."""
    join = getattr(type(config), "from_encoder_decoder_configs", None)
    encoder, decoder = getattr(config, "encoder", None), getattr(config, "decoder", None)
    if callable(join) and _is_config(encoder) and _is_config(decoder):
        join(encoder, decoder)  # sets the two flags on `decoder` in place; the returned copy is not needed
    return config


IMAGE_TOKENS = ("image_token_index", "image_token_id")


def image_token_fill(config, shrunk: dict[str, Any], used: list[int]) -> dict[str, Any]:
    """An image token id for a VLM config that leaves it None (BLIP-2, InstructBLIP, MiniCPM-V), as every published
    checkpoint of theirs sets one (the modeling code compares `input_ids == config.image_token_id`): the highest id
    of the tiny text vocabulary that no other special token of the config uses."""
    fields = _own_fields(config)
    missing = [k for k in IMAGE_TOKENS if k in fields and fields[k] is None]
    text = shrunk.get("text_config") if isinstance(shrunk.get("text_config"), dict) else shrunk
    vocab = text.get("vocab_size") or getattr(getattr(config, "text_config", config), "vocab_size", None)
    if not missing or not isinstance(vocab, int):
        return {}
    free = next((i for i in range(vocab - 1, 0, -1) if i not in used), None)
    return {missing[0]: free} if free is not None else {}
