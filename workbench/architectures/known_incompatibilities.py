"""Verdicts of the census that are real incompatibilities of the stack, not false alarms: kept as data, each with
the release it was seen on, the source line and the upstream issue.

    known_incompatibility("deberta-v2", "qlora")   # -> the reason, or None
"""

from __future__ import annotations

KNOWN: dict[tuple[str, str], str] = {
    # grad.flow reports this crash from its row in workbench/probes/forward/known_crashes.py (the message and the
    # raising frame matched against the live traceback): a fail naming this cause, not an error
    ("deberta-v2", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): under bf16 autocast DeBERTa-v2's "
        "DisentangledSelfAttention fills the bf16 attention scores with torch.finfo(query_layer.dtype).min "
        "(modeling_deberta_v2.py, `attention_scores.masked_fill(~(attention_mask), torch.finfo(query_layer.dtype)"
        ".min)`), and query_layer is fp32 because bitsandbytes' Linear4bit returns its input's dtype after "
        "prepare_model_for_kbit_training's fp32 upcast: 'value cannot be converted to type c10::BFloat16 without "
        "overflow' (the same dtype assumption as transformers #35332). forward.scenarios names it; train without "
        "autocast or keep DeBERTa-v2 unquantized"),
    ("deberta", "plain"): (
        "a real incompatibility (transformers 5.23): DisentangledSelfAttention builds q_bias and v_bias with "
        "nn.Parameter(torch.zeros(..., dtype=torch.float)) (modeling_deberta.py:160-161) and the loader keeps a tensor "
        "in the dtype its class builds it in, so a bf16 load adds fp32 biases to bf16 projections: 'float != "
        "BFloat16' without autocast (the same dtype assumption as transformers #35332); no batch runs the tiny "
        "checkpoint in bf16. dtype.fp32_islands names the biases; load in fp32, or model.to(torch.bfloat16)"),
    ("shieldgemma2", "plain"): (
        "a real incompatibility (transformers 5.23): the image-text-to-text auto mapping loads a shieldgemma2 config "
        "as Gemma3ForConditionalGeneration, while conversion_mapping.py:1201 adds a `model.` prefix to every class "
        "loaded with that config (written for ShieldGemma2ForImageClassification): a save -> load round trip misses "
        "every language-model weight (output_loading_info lists model.language_model.* as missing) and the 4-bit "
        "layers stay unquantized; no upstream issue found. dtype.quantized_census names the disagreement; load a "
        "ShieldGemma2 checkpoint with ShieldGemma2ForImageClassification"),
    ("shieldgemma2", "qlora"): (
        "a real incompatibility (transformers 5.23, peft 0.21.2): as under plain, conversion_mapping.py:1201's "
        "`model.` prefix leaves Gemma3ForConditionalGeneration's language-model weights unloaded, so its 4-bit layers "
        "keep plain Parameters and peft raises \"'Parameter' object has no attribute 'compress_statistics'\"; no "
        "upstream issue found. Load a ShieldGemma2 checkpoint with ShieldGemma2ForImageClassification"),
    ("cohere_asr", "qlora"): (
        "a real incompatibility (peft 0.21.2, transformers 5.23): the same as canary's — Cohere ASR's encoder is the "
        "Parakeet conformer (configuration_cohere_asr.py: model_type parakeet_encoder), whose BatchNorm1d buffers "
        "stay bf16 after prepare_model_for_kbit_training casts the parameters to fp32 (peft/utils/other.py:205-209): "
        "'expected scalar type Float but found BFloat16'; no upstream issue found. Cast the BatchNorm buffers to fp32 "
        "after prepare_model_for_kbit_training, or load in fp32"),
    ("fnet", "plain"): (
        "a real incompatibility (torch 2.13, transformers 5.23): FNet mixes tokens with torch.fft.fftn "
        "(modeling_fnet.py, FNetBasicFourierTransform), which has no bfloat16 kernel ('Unsupported dtype "
        "BFloat16'), so no bf16 forward runs, with or without autocast; no upstream issue found. Train FNet in fp32"),
    ("longt5", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): LongT5's feed-forward casts its input to "
        "`self.wo.weight.dtype` unless that dtype is int8 (modeling_longt5.py:288-293, copied from T5), but unlike T5 "
        "(`_keep_in_fp32_modules = ['wo']`, modeling_t5.py:537, which keeps `wo` out of 4-bit) the class declares no "
        "module to keep, so `wo` is a Params4bit whose dtype is uint8 and the activations are cast to uint8: 'result "
        "type Float can't be cast to the desired output type Byte'; no upstream issue found. Load with "
        "BitsAndBytesConfig(llm_int8_skip_modules=['wo', 'lm_head'])"),
    ("switch_transformers", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): the same cast as LongT5's "
        "(modeling_switch_transformers.py:150-155, copied from T5) with no `_keep_in_fp32_modules`, so a 4-bit `wo` "
        "(uint8) casts the activations to uint8: 'result type Float can't be cast to the desired output type Byte'; "
        "no upstream issue found. Load with BitsAndBytesConfig(llm_int8_skip_modules=['wo', 'lm_head'])"),
    ("speecht5", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): in training, SpecAugment masks the speech "
        "encoder's hidden states in place (`hidden_states[mask_time_indices] = self.masked_spec_embed`, "
        "modeling_speecht5.py:621-643) right after the feature projection, whose 4-bit output is a view made inside "
        "bitsandbytes' MatMul4Bit autograd Function: 'Output 0 of MatMul4Bit is a view and is being modified "
        "inplace'; no upstream issue found. Set mask_time_prob=0 (and mask_feature_prob=0) for 4-bit training, or "
        "keep the feature projection out of 4-bit (llm_int8_skip_modules)"),
    ("speech-encoder-decoder", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): its Wav2Vec2 encoder applies SpecAugment "
        "in place on the 4-bit feature projection's output (modeling_wav2vec2.py:1245-1267), a view made inside "
        "bitsandbytes' MatMul4Bit: 'Output 0 of MatMul4Bit is a view and is being modified inplace'; no upstream "
        "issue found. Set mask_time_prob=0 for 4-bit training, or keep feature_projection out of 4-bit"),
    ("mra", "plain"): (
        "a real incompatibility (transformers 5.23): MraSelfAttention hands query/key/value `.float()` to "
        "mra2_attention and returns its float32 context uncast (modeling_mra.py:550, MraSelfAttention.forward), so "
        "the bf16 attention.output.dense raises 'mat1 and mat2 must have the same dtype' in every cell without "
        "autocast; no upstream issue found. forward.scenarios / forward.dtype_flow / forward.mixed_precision_buffers "
        "name the class; train under autocast in one process per GPU, or in fp32"),
    ("mra", "qlora"): (
        "a real incompatibility (transformers 5.23): MraSelfAttention returns float32 (modeling_mra.py:550); "
        "prepare_model_for_kbit_training's fp32 LayerNorm absorbs it, but with every parameter cast to bf16 "
        "(FSDP2 MixedPrecisionPolicy) the next LayerNorm raises. forward.mixed_precision_buffers names the class"),
    ("xlnet", "plain"): (
        "a real incompatibility (transformers 5.23): XLNetRelativeAttention and XLNetModel.mask_emb are built with "
        "nn.Parameter(torch.FloatTensor(...)) (modeling_xlnet.py:53-61, :865), which ignores from_pretrained's "
        "dtype, so a bf16 load leaves them float32 and the einsum against bf16 hidden states raises 'expected scalar "
        "type Float but found BFloat16' without autocast; no upstream issue found. forward.scenarios / "
        "forward.dtype_flow name the class; model.to(torch.bfloat16) after loading, autocast, or fp32"),
    ("udop", "plain"): (
        "a real incompatibility (transformers 5.23): device_map='auto'/'balanced' raises IndexError in "
        "integrations/accelerate.py:88 get_module_size_with_ties (UDOP's `patch_embed` is tied into the encoder "
        "that `shared` already placed), whatever the memory (transformers #35824). parallel.device_map names it"),
    ("udop", "qlora"): (
        "a real incompatibility (transformers 5.23): device_map='auto'/'balanced' raises IndexError in "
        "integrations/accelerate.py:88 get_module_size_with_ties, whatever the memory (transformers #35824). "
        "parallel.device_map names it"),
    ("canary", "qlora"): (
        "a real incompatibility (peft 0.21.2, transformers 5.23): prepare_model_for_kbit_training casts every "
        "bf16 parameter to fp32 but no buffer (peft/utils/other.py:205-209), so the conformer convolution's "
        "BatchNorm1d keeps bf16 running_mean/running_var beside fp32 weight and bias (parakeet encoder, "
        "modeling_parakeet.py:142, :177), and F.batch_norm raises 'expected scalar type Float but found BFloat16'"
        " on every forward, eval or train; no upstream issue found (the upcast comes from peft #389). Cast the "
        "BatchNorm buffers to fp32 after prepare_model_for_kbit_training (module.float() on each nn.BatchNorm1d),"
        " or load in fp32"),
    ("seamless_m4t", "qlora"): (
        "a real incompatibility (peft 0.21.2, transformers 5.23): prepare_model_for_kbit_training casts every "
        "bf16 parameter to fp32 but no buffer (peft/utils/other.py:205-209), so the conformer convolution's "
        "BatchNorm1d keeps bf16 running_mean/running_var beside fp32 weight and bias "
        "(SeamlessM4TConformerConvolutionModule, modeling_seamless_m4t.py:439, :470), and F.batch_norm raises "
        "'expected scalar type Float but found BFloat16' on every forward, eval or train; no upstream issue found"
        " (the upcast comes from peft #389). Cast the BatchNorm buffers to fp32 after "
        "prepare_model_for_kbit_training (module.float() on each nn.BatchNorm1d), or load in fp32"),
    ("rwkv", "qlora"): (
        "a real incompatibility (transformers 5.23, peft 0.21.2, bitsandbytes 0.50.2): in eval mode RwkvModel "
        "rescales attention.output and feed_forward.value once (modeling_rwkv.py:550), for 4-bit weights by "
        "dequantizing and `setattr(target_layer, 'weight', Params4bit(...))` (modeling_rwkv.py:658); with a LoRA "
        "on those layers (PEFT's own default RWKV targets include `value` and `output`: "
        "peft/utils/constants.py:106) target_layer is peft's lora.Linear4bit, whose `weight` is a property, and "
        "the setattr raises KeyError: \"attribute 'weight' already exists\" (the error of BlinkDL/RWKV-LM#229). "
        "Training forwards (train mode) do not rescale; evaluate with rescale_every=0, or leave output/value out "
        "of target_modules"),
    ("longcat_flash", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): LongcatFlashTopkRouter reads its "
        "classifier's weight as a dense matrix (`F.linear(..., self.classifier.weight.type(torch.float32))`, "
        "modeling_longcat_flash.py:144), and `_keep_in_fp32_modules = ['classifier.weight']` (:544) names a "
        "parameter where bitsandbytes' conversion matches module names (quantizers/quantizers_utils.py:37), so "
        "the router's nn.Linear is still packed to 4 bits and every forward raises 'mat1 and mat2 shapes cannot "
        "be multiplied' (the same router defect as Llama 4's, fixed for it in transformers #44588). Load with "
        "BitsAndBytesConfig(llm_int8_skip_modules=['classifier', 'lm_head'])"),
    ("git", "qlora"): (
        "a real incompatibility (transformers 5.23): gradient checkpointing on a model whose main input is "
        "input_ids installs enable_input_require_grads (modeling_utils.py:3181-3189), which makes the frozen word"
        " embeddings' output a leaf that requires grad, and GitEmbeddings adds the position embeddings in place "
        "(`embeddings += position_embeddings`, modeling_git.py:109): 'a leaf Variable that requires grad is being"
        " used in an in-place operation' on every training step with a LoRA (frozen embeddings) and "
        "checkpointing, use_reentrant True or False. The same defect was fixed for DeBERTa in transformers "
        "#35898. Train GIT without gradient checkpointing, or patch the add out of place"),
    ("yoso", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): YosoCumulation is a "
        "torch.autograd.Function without torch.amp.custom_fwd/custom_bwd (modeling_yoso.py:104-132), so its "
        "backward runs outside autocast on what the bf16-autocast forward saved: a bf16 incoming gradient (its "
        "autocast matmul's output dtype) against an fp32 value_layer (bitsandbytes' Linear4bit returns its "
        "input's dtype after prepare_model_for_kbit_training's fp32 upcast), and `torch.matmul(grad, "
        "value.transpose(-1, -2))` raises 'expected scalar type Float but found BFloat16'; the forward passes. No"
        " upstream issue found. Train YOSO without autocast, or unquantized in one dtype"),
    ("mamba", "qlora"): (
        "a real incompatibility (transformers 5.23, bitsandbytes 0.50.2): MambaMixer's forward without the CUDA "
        "kernels reads dt_proj's weight as a dense matrix (`self.dt_proj.weight @ time_step.transpose(1, 2)`, "
        "modeling_mamba.py:438) while bitsandbytes packs that nn.Linear to 4 bits, so every forward raises "
        "'Expected size for first two dimensions of batch2 tensor'; FalconMambaMixer calls `self.dt_proj(...)` "
        "when the config is quantized (modeling_falcon_mamba.py:473-474), Mamba has no such branch. No upstream "
        "issue found. Load with BitsAndBytesConfig(llm_int8_skip_modules=['dt_proj', 'lm_head'])"),
}


def known_incompatibility(model_type: str, setup: str) -> str | None:
    return KNOWN.get((model_type, setup))
