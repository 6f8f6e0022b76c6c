"""The user's model at its real size with no weight read: built on the meta device from config.json, wrapped as the
set-up wraps it (PEFT from the user's adapter config, the 4-bit base of QLoRA, prepare_model_for_kbit_training),
then given fake storage (`to_empty` under `FakeTensorMode`): every tensor has its real shape and dtype, none holds
data.

    model = fake_model(plan_setup, fake_mode)

The 4-bit base: bitsandbytes' `Linear4bit` quantizes real data when moved to a GPU, which fake tensors do not have.
`FourBitLinear` stands in for it with the same memory behaviour, read from bitsandbytes 0.50's source: the weight
stored as packed uint8 (two 4-bit values a byte, `Params4bit` of shape (n/2, 1)), the blockwise absmax (one fp32 per
64 values, or with double quantization one byte per 64 values plus one fp32 per 256 blocks), and a matmul that
dequantizes the whole weight to the compute dtype as a temporary and saves only its input for backward, where it
dequantizes again (`bitsandbytes/autograd/_functions.py`, `MatMul4Bit`). PEFT wraps it as it wraps any nn.Linear.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

BLOCKSIZE = 64  # bitsandbytes' 4-bit blocksize (BitsAndBytesConfig default; bnb.functional.quantize_4bit)
DOUBLE_QUANT_BLOCKSIZE = 256  # blocks of absmax quantized together under bnb_4bit_use_double_quant


class _DequantizingMatmul(torch.autograd.Function):
    """MatMul4Bit's memory: the dequantized weight is a temporary in forward and again in backward; only the input
    is saved."""

    @staticmethod
    def forward(ctx, x, packed, out_features, in_features):
        weight = torch.empty((out_features, in_features), dtype=x.dtype, device=x.device)
        ctx.save_for_backward(x)
        ctx.shape = (out_features, in_features)
        ctx.packed = packed
        return torch.nn.functional.linear(x, weight)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        weight = torch.empty(ctx.shape, dtype=grad_out.dtype, device=grad_out.device)
        return grad_out @ weight, None, None, None


class Params4bit(nn.Parameter):
    """A 4-bit weight's parameter, named as bitsandbytes' class: accelerate recognises bitsandbytes' weights by that
    name (`fsdp2_prepare_model` leaves frozen non-floating ones out of FSDP sharding, and skips its fp32 upcast of the
    trainable parameters when a model has any)."""


class FourBitLinear(nn.Linear):
    """An nn.Linear whose weight is stored as bitsandbytes stores a 4-bit one (module docstring)."""

    def __init__(self, linear: nn.Module, compute_dtype: torch.dtype, double_quant: bool) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = _features(linear)
        n = self.in_features * self.out_features
        device = linear.weight.device
        self.weight = Params4bit(torch.empty((math.ceil(n / 2), 1), dtype=torch.uint8, device=device),
                                 requires_grad=False)
        blocks = math.ceil(n / BLOCKSIZE)
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
            self.register_buffer("absmax_scale", torch.empty(math.ceil(blocks / DOUBLE_QUANT_BLOCKSIZE),
                                                             dtype=torch.float32, device=device))
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, device=device))
        self.bias = linear.bias
        self.compute_dtype = compute_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # as bitsandbytes' Linear4bit.forward (0.50.2, nn/modules.py:626-637): computed in the compute dtype,
        # returned in the input's (fp32 after prepare_model_for_kbit_training's upcast of the norms)
        out = _DequantizingMatmul.apply(x.to(self.compute_dtype), self.weight, self.out_features, self.in_features)
        out = out + self.bias.to(out.dtype) if self.bias is not None else out
        return out.to(x.dtype)


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2's attention and MLP: weight stored (in, out))."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return False
    return isinstance(module, Conv1D)


def _features(module: nn.Module) -> tuple[int, int]:
    """(in, out) of an nn.Linear or a Conv1D, as transformers' `replace_with_bnb_linear` reads them before making a
    Linear4bit."""
    return tuple(module.weight.shape) if _is_conv1d(module) else (module.in_features, module.out_features)


def _quantizable(module: nn.Module) -> bool:
    """What transformers' bitsandbytes integration converts: an nn.Linear itself, or a Conv1D."""
    return type(module) is nn.Linear or _is_conv1d(module)


def modules_left_unquantized(model: nn.Module, skip_modules: list[str] | None) -> list[str]:
    """What transformers' bitsandbytes quantizer leaves out of 4-bit, asked from the installed release
    (`Bnb4BitHfQuantizer._process_model_before_weight_loading`, transformers 5.x: `get_modules_to_not_convert` over the
    quantization config's `llm_int8_skip_modules` and the class' `_keep_in_fp32_modules`, such as T5's `wo`, whose
    forward casts its input to the weight's dtype): the output head, tied and last modules, those. A release without
    that helper: the output head, the skip list and `_keep_in_fp32_modules`."""
    keep_fp32 = sorted(getattr(model, "_keep_in_fp32_modules", None) or [])
    try:
        from transformers.quantizers.base import HfQuantizer

        return sorted(HfQuantizer.get_modules_to_not_convert(model, skip_modules, keep_fp32))
    except (ImportError, AttributeError, TypeError):
        return sorted(output_head_names(model) | set(skip_modules or []) | set(keep_fp32))


def _converted(full_name: str, left_out: list[str]) -> bool:
    """transformers' own name matching (`quantizers_utils.should_convert_module`), else a suffix match."""
    try:
        from transformers.quantizers.quantizers_utils import should_convert_module
    except ImportError:
        return not any(full_name == s or full_name.endswith(f".{s}") for s in left_out)
    return should_convert_module(full_name, left_out)


def quantize_4bit(model: nn.Module, compute_dtype: torch.dtype, double_quant: bool, left_out: list[str]) -> list[str]:
    """Every nn.Linear or Conv1D that transformers' bitsandbytes integration would convert (not in `left_out`:
    `modules_left_unquantized`) replaced by a FourBitLinear, as the integration replaces them with Linear4bit; the
    names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if _quantizable(child) and _converted(full, left_out):
                setattr(module, child_name, FourBitLinear(child, compute_dtype, double_quant))
                replaced.append(full)
    return replaced


def on_fake_storage(model: nn.Module, fake_mode, device: str) -> nn.Module:
    """The meta model's tensors given fake storage on `device` (shapes and dtypes kept)."""
    with fake_mode:
        model.to_empty(device=device)
    return model


def output_head_names(model: nn.Module) -> set[str]:
    """The output embeddings' attribute name (lm_head, embed_out, …): left unquantized, as transformers does."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m is head and n}
    return names or {"lm_head"}


def describe_trainable(model: nn.Module) -> dict[str, Any]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable_parameters": trainable, "parameters": total}
