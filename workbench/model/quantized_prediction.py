"""What `from_pretrained(quantization_config=...)` will hold, predicted on the meta device: no weight is read.

transformers' own bitsandbytes quantizer is asked which parameters it quantizes (`param_needs_quantization`) on a
meta-device skeleton; each quantized tensor is stored packed in the quantizer's storage dtype, the others in the
load dtype (fp32 where `_keep_in_fp32_modules` says so). The dtype census (`probes.dtype.census`) and the memory
check before a load (`model.memory`) both read this.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from workbench.model.dtypes import keep_in_fp32_matcher
from workbench.model.loading import bnb_config, config_dtype, meta_model, model_class_for


@dataclasses.dataclass(frozen=True)
class PredictedTensor:
    name: str
    kind: str  # parameter | buffer
    dtype: torch.dtype
    elements: int  # as stored (packed 4-bit values count in storage elements)

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.itemsize


def predicted_tensors(config, quant: str, dtype: torch.dtype | None = None) -> tuple[nn.Module, list[PredictedTensor]]:
    """The meta skeleton and every tensor a quantized load of `config` will hold."""
    dtype = dtype or config_dtype(config)
    qconfig = bnb_config(quant, compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
                         model_class=model_class_for(config))
    skeleton, hf_quantizer = meta_model(config, dtype, qconfig)
    if quant == "4bit":
        storage = getattr(qconfig, "bnb_4bit_quant_storage", None) or torch.uint8
        storage = getattr(torch, storage) if isinstance(storage, str) else storage
        bits_per_value = 4
    else:
        storage, bits_per_value = torch.int8, 8
    storage_bits = torch.finfo(storage).bits if storage.is_floating_point else torch.iinfo(storage).bits
    keep_fp32 = keep_in_fp32_matcher(skeleton)
    tensors = []
    for name, p in skeleton.named_parameters():
        if hf_quantizer is not None and hf_quantizer.param_needs_quantization(skeleton, name):
            tensors.append(PredictedTensor(name, "parameter", storage, math.ceil(p.numel() * bits_per_value
                                                                                 / storage_bits)))
        else:
            kept = (torch.float32 if keep_fp32(name) else dtype) if p.dtype.is_floating_point else p.dtype
            tensors.append(PredictedTensor(name, "parameter", kept, p.numel()))
    # buffers as the skeleton holds them, but those `_keep_in_fp32_modules(_strict)` names (DeepSeek-V3's router
    # e_score_correction_bias): from_pretrained keeps buffers and parameters alike in fp32 there
    tensors += [PredictedTensor(name, "buffer", torch.float32 if b.is_floating_point() and keep_fp32(name) else b.dtype,
                                b.numel()) for name, b in skeleton.named_buffers()]
    return skeleton, tensors


def predicted_load_bytes(config, quant: str) -> int:
    """Bytes the quantized load's tensors will take."""
    return sum(t.nbytes for t in predicted_tensors(config, quant)[1])
