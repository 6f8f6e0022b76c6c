"""What `from_pretrained(quantization_config=...)` will hold, predicted on the meta device: no weight is read.

transformers' own bitsandbytes quantizer is asked which parameters it quantizes (`param_needs_quantization`) on a
meta-device skeleton; each quantized tensor is stored packed in the quantizer's storage dtype. Every other tensor
gets the dtype from_pretrained gives it (`load_dtype`). The dtype census (`probes.dtype.census`) and the memory
check before a load (`model.memory`) both read this.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
from torch import nn

from workbench.model.dtypes import dtype_plan_matcher
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


def load_dtype(skeleton_dtype: torch.dtype, planned: torch.dtype | None) -> torch.dtype:
    """The dtype a checkpoint tensor that is not quantized ends in, by transformers 5.23's rule
    (core_model_loading.py, `convert_and_load_state_dict_in_model`): the dtype plan's where it names the tensor,
    else the dtype the class built it in, which is the load dtype (the model is built under it) unless the class
    chose another (XLNet's `torch.FloatTensor` parameters, DeBERTa's fp32 `q_bias`, Mamba's `A_log`). Integer
    tensors keep theirs."""
    if skeleton_dtype.is_floating_point and planned is not None:
        return planned
    return skeleton_dtype


def predicted_tensors(config, quant: str, dtype: torch.dtype | None = None) -> tuple[nn.Module, list[PredictedTensor]]:
    """The meta skeleton and every tensor a quantized load of `config` will hold."""
    dtype = dtype or config_dtype(config)
    qconfig = bnb_config(quant, compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
                         model_class=model_class_for(config))
    # built in the load dtype as from_pretrained builds it (`_from_config` would build it in `config.dtype`), so
    # that a tensor in another dtype is one the class chose
    config = copy.deepcopy(config)
    config.dtype = dtype
    skeleton, hf_quantizer = meta_model(config, dtype, qconfig)
    if quant == "4bit":
        storage = getattr(qconfig, "bnb_4bit_quant_storage", None) or torch.uint8
        storage = getattr(torch, storage) if isinstance(storage, str) else storage
        bits_per_value = 4
    else:
        storage, bits_per_value = torch.int8, 8
    storage_bits = torch.finfo(storage).bits if storage.is_floating_point else torch.iinfo(storage).bits
    planned = dtype_plan_matcher(skeleton, dtype)
    tensors = []
    for name, p in skeleton.named_parameters():
        if hf_quantizer is not None and hf_quantizer.param_needs_quantization(skeleton, name):
            tensors.append(PredictedTensor(name, "parameter", storage, math.ceil(p.numel() * bits_per_value
                                                                                 / storage_bits)))
        else:
            tensors.append(PredictedTensor(name, "parameter", load_dtype(p.dtype, planned(name)), p.numel()))
    # buffers by the same rule where the checkpoint holds them (DeepSeek-V3's router e_score_correction_bias,
    # `_keep_in_fp32_modules_strict`); a non-persistent buffer is never loaded and keeps the dtype it was built in
    saved = set(skeleton.state_dict())
    tensors += [PredictedTensor(name, "buffer", load_dtype(b.dtype, planned(name) if name in saved else None),
                                b.numel()) for name, b in skeleton.named_buffers()]
    return skeleton, tensors


def predicted_load_bytes(config, quant: str) -> int:
    """Bytes the quantized load's tensors will take."""
    return sum(t.nbytes for t in predicted_tensors(config, quant)[1])
