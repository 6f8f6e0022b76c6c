"""Tiny healthy checkpoints of the model families people fine-tune, built from transformers' own config classes.

Random weights, a few layers, saved with `save_pretrained` in the dtype each family is usually trained in (bf16;
fp32 for GPT-2, T5 and BERT). They are the family matrix of the tests: every probe must stay quiet on each of
them, and planted defects must be named on several of them.

    folder = build_family("qwen2_tied", tmp_path)     # -> tmp_path / "qwen2_tied", loadable with from_pretrained
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    head: str  # causal_lm | image_text_to_text | seq2seq_lm | seq_cls | token_cls | encoder
    model_class: str  # a transformers class name
    config: Callable[[], Any]
    dtype: str = "bfloat16"
    note: str = ""


def _t(name: str, **kw):
    def make():
        import transformers

        return getattr(transformers, name)(**kw)
    return make


def _llava():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    return LlavaConfig(vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                      num_attention_heads=2, image_size=32, patch_size=8),
                       text_config=LlamaConfig(**TEXT), image_token_index=255, image_seq_length=16,
                       vision_feature_layer=-1, projector_hidden_act="gelu")


def _qwen2_vl():
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(text_config=dict(**TEXT, bos_token_id=1, eos_token_id=2,
                                          rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                         vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=14,
                                            spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
                         image_token_id=250, video_token_id=251, vision_start_token_id=252, vision_end_token_id=253,
                         bos_token_id=1, eos_token_id=2)


def _gemma3_vlm():
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    return Gemma3Config(text_config=Gemma3TextConfig(**{**TEXT, "head_dim": 16, "sliding_window": 64}),
                        vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                         num_attention_heads=2, image_size=32, patch_size=8),
                        mm_tokens_per_image=4, image_token_index=255, boi_token_index=253, eoi_token_index=254)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "causal_lm", "LlamaForCausalLM", _t("LlamaConfig", **TEXT, tie_word_embeddings=False)),
    Family("mistral", "causal_lm", "MistralForCausalLM", _t("MistralConfig", **TEXT, tie_word_embeddings=False)),
    Family("qwen2_tied", "causal_lm", "Qwen2ForCausalLM", _t("Qwen2Config", **TEXT, tie_word_embeddings=True),
           note="tied embeddings: lm_head is embed_tokens"),
    Family("gemma3_text", "causal_lm", "Gemma3ForCausalLM",
           _t("Gemma3TextConfig", **TEXT, head_dim=16, sliding_window=64),
           note="tied; RMSNorm casts back to the input dtype; two rotary buffers (global and sliding)"),
    Family("gpt2", "causal_lm", "GPT2LMHeadModel", _t("GPT2Config", vocab_size=256, n_embd=64, n_layer=2, n_head=4,
                                                       n_positions=256, bos_token_id=1, eos_token_id=2), dtype="float32",
           note="Conv1D projections, tied, fp32"),
    Family("mixtral", "causal_lm", "MixtralForCausalLM",
           _t("MixtralConfig", **TEXT, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
           note="mixture of experts"),
    Family("t5", "seq2seq_lm", "T5ForConditionalGeneration",
           _t("T5Config", vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
              decoder_start_token_id=0), dtype="float32", note="encoder-decoder, tied"),
    Family("bert_seq_cls", "seq_cls", "BertForSequenceClassification",
           _t("BertConfig", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, num_labels=3), dtype="float32"),
    Family("bert_token_cls", "token_cls", "BertForTokenClassification",
           _t("BertConfig", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, num_labels=5), dtype="float32"),
    Family("bert_encoder", "encoder", "BertModel",
           _t("BertConfig", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256), dtype="float32",
           note="a bare encoder, as sentence-transformers fine-tunes it"),
    Family("llava", "image_text_to_text", "LlavaForConditionalGeneration", _llava, note="CLIP tower + projector"),
    Family("qwen2_vl", "image_text_to_text", "Qwen2VLForConditionalGeneration", _qwen2_vl),
    Family("gemma3_vlm", "image_text_to_text", "Gemma3ForConditionalGeneration", _gemma3_vlm,
           note="SigLIP tower + multimodal projector"),
)}


def build_family(name: str, parent: str | Path) -> Path:
    """Save the tiny healthy checkpoint of `name` under `parent/name` (rebuilt identically from seed 0)."""
    import torch
    import transformers

    family = FAMILIES[name]
    folder = Path(parent) / name
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    config = family.config()
    config.dtype = family.dtype
    model = getattr(transformers, family.model_class)(config).to(getattr(torch, family.dtype)).eval()
    model.save_pretrained(folder)
    return folder
