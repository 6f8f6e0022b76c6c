"""The architectures the census covers: every model type of transformers' auto-mappings for the heads people
fine-tune, each with the one head (and class) it is tried with.

    for arch in architectures(): arch.model_type, arch.head, arch.class_name

A model type mapped for several heads is tried with the most specific: image-text-to-text, speech
sequence-to-sequence, sequence-to-sequence LM, causal LM, then sequence and token classification. Encoders
(types with a masked-LM head) are tried as sequence classifiers, as they are fine-tuned: their causal-LM class
(`BertLMHeadModel`) is a decoder variant few train.
"""

from __future__ import annotations

import dataclasses

# head -> the auto-mapping transformers keeps for it (transformers.models.auto.modeling_auto)
MAPPINGS = {
    "image_text_to_text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "speech_seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "seq2seq_lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "seq_cls": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token_cls": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
}


@dataclasses.dataclass(frozen=True)
class Architecture:
    model_type: str
    head: str  # a key of MAPPINGS
    class_name: str


def _table(head: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    table = getattr(modeling_auto, MAPPINGS[head])
    return {k: (v[0] if isinstance(v, (list, tuple)) else v) for k, v in table.items()}


def architectures() -> list[Architecture]:
    """Every model type of the mappings, once, sorted by name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    tables = {head: _table(head) for head in MAPPINGS}
    types = sorted({t for table in tables.values() for t in table})
    out = []
    for model_type in types:
        order = list(MAPPINGS)
        if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and model_type in tables["seq_cls"]:
            order.remove("causal_lm")  # an encoder: tried as it is fine-tuned, with a classification head
        head = next(h for h in order if model_type in tables[h])
        out.append(Architecture(model_type, head, tables[head][model_type]))
    return out
