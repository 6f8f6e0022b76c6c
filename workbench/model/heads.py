"""The one place that knows a model's head: what it computes, which labels fit it, which loss a probe backpropagates,
and which PEFT task type a fresh LoRA on it takes.

The head kind is read structurally: the class's place in transformers' task auto-mappings (the same tables
`AutoModelFor...` uses), else the forward signature. Never from name substrings.

    causal_lm            *ForCausalLM, GPT2LMHeadModel       labels = input_ids        loss from the model
    image_text_to_text   LLaVA, Qwen2-VL, Gemma 3 (VLMs)     labels = input_ids        loss from the model
    seq2seq_lm           T5ForConditionalGeneration, BART    labels = input_ids        loss from the model
    seq_cls              *ForSequenceClassification          one class id per row      loss from the model
    token_cls            *ForTokenClassification             one class id per token    loss from the model
    encoder              a bare model (BertModel, ...)       none                      mean of its hidden states
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

HEADS = ("causal_lm", "image_text_to_text", "seq2seq_lm", "seq_cls", "token_cls", "encoder")
PEFT_TASK_TYPES = {"causal_lm": "CAUSAL_LM", "image_text_to_text": "CAUSAL_LM", "seq2seq_lm": "SEQ_2_SEQ_LM",
                   "seq_cls": "SEQ_CLS", "token_cls": "TOKEN_CLS", "encoder": "FEATURE_EXTRACTION"}
GENERATES = frozenset({"causal_lm", "image_text_to_text", "seq2seq_lm"})
DESCRIPTIONS = {"causal_lm": "causal LM", "image_text_to_text": "image-text-to-text (VLM)",
                "seq2seq_lm": "sequence-to-sequence LM", "seq_cls": "sequence classification",
                "token_cls": "token classification", "encoder": "bare model (no head)"}


@functools.lru_cache(maxsize=1)
def _class_heads() -> dict[str, str]:
    """transformers class name -> head kind, from the auto-mappings (first mapping wins, most specific first)."""
    from transformers.models.auto import modeling_auto as auto

    tables = (("image_text_to_text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
              ("image_text_to_text", "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES"),
              ("seq2seq_lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
              ("causal_lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
              ("seq_cls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
              ("token_cls", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
              ("encoder", "MODEL_MAPPING_NAMES"))
    out: dict[str, str] = {}
    for head, table in tables:
        for names in getattr(auto, table, {}).values():
            for name in (names if isinstance(names, (tuple, list)) else (names,)):
                out.setdefault(name, head)
    return out


def _from_signature(model) -> str:
    """For classes outside the auto-mappings (remote code): read the forward signature and the config."""
    try:
        params = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = set()
    config = getattr(model, "config", None)
    if "pixel_values" in params and getattr(config, "vision_config", None) is not None:
        return "image_text_to_text"
    if "decoder_input_ids" in params:
        return "seq2seq_lm"
    if "labels" not in params:
        return "encoder"
    try:
        if model.get_output_embeddings() is not None:
            return "causal_lm"
    except (AttributeError, NotImplementedError):
        pass
    return "causal_lm"


def head_of_class(cls: type) -> str | None:
    """The head of a transformers class from the auto-mappings alone (None when it is in none of them)."""
    return next((_class_heads()[c.__name__] for c in cls.__mro__ if c.__name__ in _class_heads()), None)


# modules of a classification head: PEFT trains them fully (modules_to_save), so 4-bit loading must leave them out
CLASSIFIER_MODULES = ("classifier", "score")


def head_kind(model) -> str:
    """The head of a (possibly PEFT/DDP-wrapped) transformers model: one of HEADS."""
    from workbench.model.components import unwrap_model

    inner, _ = unwrap_model(model)
    for cls in type(inner).__mro__:
        head = _class_heads().get(cls.__name__)
        if head is not None:
            return head
    return _from_signature(inner)


def generates(model) -> bool:
    return head_kind(model) in GENERATES


def labels_for(model, inputs: dict) -> Any:
    """Labels that fit the head for this batch, or None when the head takes none (a bare model)."""
    import torch

    from workbench.model.components import unwrap_model

    head = head_kind(model)
    ids = inputs.get("input_ids")
    if ids is None and head == "seq2seq_lm":  # speech-to-text (input_features): the decoder's labels are token ids
        config = getattr(unwrap_model(model)[0], "config", None)
        vocab = int(getattr(getattr(config, "text_config", config), "vocab_size", 100) or 100)
        rows = next((v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor)), 1)
        device = next((v.device for v in inputs.values() if isinstance(v, torch.Tensor)), None)
        return torch.randint(3, max(4, vocab), (rows, 8), generator=torch.Generator().manual_seed(0)).to(device)
    if ids is None:
        return None
    if head in ("causal_lm", "image_text_to_text", "seq2seq_lm"):
        return ids.clone()
    config = getattr(unwrap_model(model)[0], "config", None)
    num_labels = int(getattr(config, "num_labels", 2) or 2)
    if head == "seq_cls":
        problem = getattr(config, "problem_type", None)
        if problem == "multi_label_classification":
            return torch.zeros(ids.shape[0], num_labels, dtype=torch.float32, device=ids.device)
        if num_labels == 1 or problem == "regression":
            return torch.zeros(ids.shape[0], dtype=torch.float32, device=ids.device)
        return torch.arange(ids.shape[0], device=ids.device) % num_labels
    if head == "token_cls":
        return torch.arange(ids.numel(), device=ids.device).reshape(ids.shape) % num_labels
    return None


def loss_of(out: Any):
    """The loss a probe backpropagates: the model's own (labels given), else the mean of what the head computes —
    logits, or for a bare model every hidden-state output it returns (last_hidden_state, and pooler_output where the
    model has a pooler), so that every parameter a user's loss on them could reach is probed."""
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    logits = getattr(out, "logits", None)
    if logits is not None:
        return logits.float().mean()
    parts = [getattr(out, k, None) for k in ("last_hidden_state", "pooler_output")]
    parts = [p for p in parts if p is not None]
    if not parts:
        parts = [out[0]]
    return sum(p.float().mean() for p in parts)
