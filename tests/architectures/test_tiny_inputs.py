"""Tiny configs that keep what the modeling code and the config validators ask for, and the inputs built from a
model's own contract beside its token ids: each rule where it applies (the type that needs it) and a healthy twin
where it leaves the config or the batch as it was."""

import pytest
import torch

from workbench.architectures.tiny_config import modeling_mrope_default, tiny_config
from workbench.model import multimodal_inputs as mm


def _config(model_type, **overrides):
    from transformers import CONFIG_MAPPING

    return tiny_config(type(CONFIG_MAPPING[model_type]()), **overrides)


def _model(model_type, class_name):
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, class_name)(_config(model_type)).eval()


def test_sizes_the_class_leaves_none_get_their_documented_derivation():
    ministral = _config("ministral")  # head_dim None: the model builds head_dim ** -0.5 from it
    assert ministral.head_dim == ministral.hidden_size // ministral.num_attention_heads
    nemotron = _config("nemotron")  # num_key_value_heads None: the attention divides by it
    assert nemotron.num_key_value_heads == nemotron.num_attention_heads
    mistral = _config("mistral")  # healthy: a set head_dim and grouped kv heads (8 of 32) stay as shrunk
    assert (mistral.head_dim, mistral.num_key_value_heads) == (16, 2)


def test_experts_per_token_never_exceed_the_shrunk_experts_through_the_attribute_map():
    ernie = _config("ernie4_5_moe")  # `moe_k` is num_experts_per_tok through attribute_map: 6 of 4 experts before
    assert ernie.moe_k <= ernie.moe_num_experts == 4
    deepseek = _config("deepseek_v2")  # None in the class, a topk(k=None) in the router
    assert deepseek.num_experts_per_tok == 2 and deepseek.n_routed_experts == 4
    qwen = _config("qwen3_moe")  # healthy: already within the experts
    assert (qwen.num_experts_per_tok, qwen.num_experts) == (2, 4)
    xglm = _config("xglm")  # `attention_heads` is num_attention_heads through attribute_map: 16 heads of width 4
    assert (xglm.attention_heads, xglm.d_model) == (4, 64)


def test_an_encoder_decoder_gets_the_decoder_start_its_checkpoints_carry():
    t5 = _config("t5")
    assert t5.decoder_start_token_id == t5.pad_token_id == 0
    composite = _config("encoder-decoder")  # EncoderDecoderConfig: its decoder's ids
    assert composite.pad_token_id == composite.decoder.pad_token_id
    assert composite.decoder_start_token_id == composite.decoder.pad_token_id
    bart = _config("bart")  # healthy: its own start id is kept
    assert bart.decoder_start_token_id == 2


def test_per_layer_lists_keep_every_kind_of_layer_at_the_tiny_depth():
    hybrid = _config("olmo_hybrid")  # the 32-layer list cut to 2 would hold no attention layer
    assert "full_attention" in hybrid.layer_types and len(hybrid.layer_types) == hybrid.num_hidden_layers
    qwen = _config("qwen3_5").text_config  # [linear x 3, full] x 8: the rope index needs the attention layer
    assert qwen.layer_types == ["linear_attention", "full_attention"]
    gemma2 = _config("gemma2")  # healthy: both kinds fit in two layers, the cut is the plain prefix
    assert gemma2.layer_types == type(gemma2)().layer_types[:2]


def test_sizes_that_split_the_width_split_the_tiny_width():
    reformer = _config("reformer")  # (64, 192) of 256, concatenated by its axial position embeddings
    assert sum(reformer.axial_pos_embds_dim) == reformer.hidden_size == 64
    assert tuple(reformer.axial_pos_shape) == (64, 64)  # a shape, not a split of the width: kept


def test_a_composite_type_builds_the_sub_config_its_head_class_takes():
    from transformers import LlamaConfig, LlamaForCausalLM, MusicgenDecoderConfig, MusicgenForCausalLM

    from workbench.architectures.checkpoints import config_the_class_takes

    decoder = config_the_class_takes(MusicgenForCausalLM, _config("musicgen"))
    assert isinstance(decoder, MusicgenDecoderConfig) and decoder.hidden_size == 64
    llama = _config("llama")  # healthy: the class takes the mapped config itself
    assert config_the_class_takes(LlamaForCausalLM, llama) is llama and isinstance(llama, LlamaConfig)


def test_mrope_sections_follow_the_modeling_default_and_the_rotary_fraction():
    assert modeling_mrope_default(_config("glm4v_moe").text_config) == [8, 12, 12]
    glm = _config("glm4v_moe").text_config  # rotates half of each head: sections sum to a quarter of head_dim
    head_dim = glm.hidden_size // glm.num_attention_heads
    assert sum(glm.rope_parameters["mrope_section"]) == head_dim // 4
    paddle = _config("paddleocr_vl").text_config  # the class names no split; its modeling code defaults one
    assert sum(paddle.rope_parameters["mrope_section"]) == paddle.head_dim // 2
    assert modeling_mrope_default(_config("llama")) is None  # healthy: no M-RoPE, nothing added
    vision = _config("qwen2_vl").vision_config  # a vision tower rotates patches, not text positions: nothing added
    assert "mrope_section" not in (getattr(vision, "rope_parameters", None) or {})
    assert "mrope_section" not in (_config("llama").rope_parameters or {})


def test_a_vlm_without_an_image_token_gets_a_free_id_of_its_tiny_vocabulary():
    blip2 = _config("blip-2")
    assert blip2.image_token_index is not None and blip2.image_token_index < blip2.text_config.vocab_size
    assert blip2.image_token_index not in (blip2.text_config.pad_token_id, blip2.text_config.eos_token_id)
    llava = _config("llava")  # healthy: its own id stays
    assert llava.image_token_id == 32000


def test_layout_boxes_fit_the_model_contract_and_run_its_forward():
    bros = _model("bros", "BrosForTokenClassification")
    ids = torch.randint(3, 200, (1, 16))
    inputs, how = mm.beside_token_inputs(bros, bros.config, ids)
    assert inputs["bbox"].is_floating_point() and inputs["bbox"].shape == (1, 16, 4) and "normalized" in how
    assert bros(**inputs).logits.shape[:2] == (1, 16)  # the forward raised "You have to specify bbox" without
    layoutlm = _model("layoutlm", "LayoutLMForSequenceClassification")
    boxes = mm.beside_token_inputs(layoutlm, layoutlm.config, ids)[0]["bbox"]
    assert boxes.dtype == torch.long and 0 <= int(boxes.min()) and int(boxes.max()) <= 1000
    assert (boxes[..., 2] >= boxes[..., 0]).all() and (boxes[..., 3] >= boxes[..., 1]).all()
    bert = _model("bert", "BertForSequenceClassification")  # healthy: nothing beside the ids
    assert mm.beside_token_inputs(bert, bert.config, ids) is None


def test_language_ids_name_the_configs_first_language():
    xmod = _model("xmod", "XmodForSequenceClassification")
    ids = torch.randint(3, 200, (1, 16))
    with pytest.raises(ValueError, match="Input language unknown"):
        xmod(input_ids=ids)
    inputs, how = mm.beside_token_inputs(xmod, xmod.config, ids)
    assert inputs["lang_ids"].tolist() == [0] and "en_XX" in how
    assert xmod(**inputs).logits.shape == (1, 2)


def test_required_companion_ids_come_from_their_part_of_the_config():
    from transformers import Blip2ForConditionalGeneration, InstructBlipForConditionalGeneration

    instruct = _config("instructblip")
    extra = mm.companion_ids(InstructBlipForConditionalGeneration.__new__(InstructBlipForConditionalGeneration),
                             instruct)
    assert set(extra) == {"qformer_input_ids", "qformer_attention_mask"}
    assert int(extra["qformer_input_ids"].max()) < instruct.qformer_config.vocab_size
    assert mm.companion_ids(Blip2ForConditionalGeneration.__new__(Blip2ForConditionalGeneration),
                            _config("blip-2")) == {}


def test_the_image_is_resized_to_the_towers_image_size():
    blip2 = _config("blip-2")
    processor = mm.mapped_image_processor(blip2)  # BLIP's processor resizes to 384, the tower is 224
    assert mm._tower_size(processor, blip2) == {"size": {"height": 224, "width": 224}}
    paligemma = _config("paligemma")  # healthy: processor and tower agree
    assert mm._tower_size(mm.mapped_image_processor(paligemma), paligemma) == {}


def test_a_composite_takes_its_encoders_processor_and_its_text_as_labels():
    from PIL import Image

    model = _model("vision-encoder-decoder", "VisionEncoderDecoderModel")
    inputs, how = mm.image_beside_text(model, model.config, Image.new("RGB", (224, 224), color="red"))
    assert set(inputs) == {"pixel_values", "labels"} and "ViTImageProcessor" in how and "as labels" in how
    assert model(**inputs).loss is not None


def test_codebook_decoders_get_their_ids_once_per_codebook():
    from transformers import MusicgenForCausalLM

    from workbench.architectures.checkpoints import config_the_class_takes

    torch.manual_seed(0)
    model = MusicgenForCausalLM(config_the_class_takes(MusicgenForCausalLM, _config("musicgen"))).eval()
    ids = torch.randint(3, 200, (1, 16))
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        model(input_ids=ids)
    inputs, how = mm.codebook_ids(model.config, ids)
    assert inputs["input_ids"].shape == (4, 16) and "4 codebooks" in how
    assert model(**inputs).logits.shape[-2:] == (16, model.config.vocab_size)
    assert mm.codebook_ids(_config("llama"), ids) is None  # healthy: no codebooks


def test_a_model_that_cannot_take_every_kind_of_layer_is_built_on_the_prefix(tmp_path):
    import json

    from transformers import ZambaForCausalLM

    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import Architecture

    with pytest.raises(ValueError, match="tie_weights_keys"):  # one hybrid layer: its shared-block tying needs two
        ZambaForCausalLM(_config("zamba"))
    folder = build_tiny_checkpoint(Architecture("zamba", "causal_lm", "ZambaForCausalLM"), tmp_path)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["layers_block_type"] == ["linear_attention", "linear_attention"]  # the prefix
    folder = build_tiny_checkpoint(Architecture("qwen3_next", "causal_lm", "Qwen3NextForCausalLM"), tmp_path)
    saved = json.loads((folder / "config.json").read_text())  # healthy: the attention layer is kept
    assert saved["layer_types"] == ["linear_attention", "full_attention"]


@pytest.mark.parametrize("heads, kv, expected_kv", [(2, 2, 2), (32, 32, 4), (32, 8, 2), (32, 1, 1)],
                         ids=["mha-under-the-tiny-heads", "mha", "gqa", "mqa"])
def test_key_value_heads_keep_the_attention_kind_and_never_outnumber_the_query_heads(heads, kv, expected_kv):
    """Multi-head stays multi-head with as many key-value heads as query heads, also where the config already has
    fewer query heads than a tiny one (2: it had 4 key-value heads for 2 query heads, and its forward failed in
    SDPA); grouped becomes two groups, multi-query stays multi-query."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.architectures.tiny_config import shrunk_fields

    config = LlamaConfig(vocab_size=64, hidden_size=16 * heads, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv)
    shrunk = LlamaConfig(**{**config.to_dict(), **shrunk_fields(config, vocab=64)})
    assert (shrunk.num_attention_heads, shrunk.num_key_value_heads) == (min(heads, 4), expected_kv)
    ids = torch.arange(8).unsqueeze(0)
    torch.manual_seed(0)
    assert torch.isfinite(LlamaForCausalLM(shrunk)(input_ids=ids, labels=ids).loss)
