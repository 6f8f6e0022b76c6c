"""A checkpoint whose config.json declares bitsandbytes quantization over 16-bit weights, as transformers loads it.

transformers 5.23 treats a `quantization_config` in config.json as a pre-quantized save: it replaces the Linear
layers with bitsandbytes' `Linear4bit` / `Linear8bitLt` and loads the saved tensors into them as they are, without
quantizing them and without an error. The layers then hold bf16/fp16 weights with no quant state: bitsandbytes'
forward raises a bare `AssertionError` (bitsandbytes 0.50.2 nn/modules.py:498,
`fix_4bit_weight_quant_state_from_module`), and PEFT's LoRA on them raises "'Parameter' object has no attribute
'compress_statistics'" (peft 0.21.2 tuners/lora/bnb.py:585). `config.quantization` (notebook 00) judges the
declaration from the files; the probes that need a forward or a LoRA say this cause instead of those tracebacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

BNB_LAYERS = {"Linear4bit": "4-bit", "LinearFP4": "4-bit", "LinearNF4": "4-bit", "Linear8bitLt": "8-bit"}


class DeclaredQuantizationNotApplied(Exception):
    """The loaded model's bitsandbytes layers hold unquantized floating weights: the checkpoint declares a
    quantization its weights do not have. Carries the finding's title, evidence and fix (Finding.from_exception)."""

    def __init__(self, layers: list[tuple[str, str, str]]) -> None:
        import transformers

        name, kind, dtype = layers[0]
        bits = BNB_LAYERS.get(kind, "k-bit")
        super().__init__(
            f"config.json declares bitsandbytes {bits} (quantization_config), but the weights are {dtype}: "
            f"transformers {transformers.__version__} loads them as a pre-quantized save without quantizing them, so "
            f"{len(layers)} {kind} layer(s) hold {dtype} weights with no quant state (e.g. {name}); their forward "
            "raises a bare AssertionError in bitsandbytes and a LoRA on them \"no attribute 'compress_statistics'\". "
            "config.quantization (notebook 00) reports the declaration.")
        self.finding_title = f"The checkpoint declares bitsandbytes {bits} over {dtype} weights"
        self.evidence = {"unquantized_bitsandbytes_layers": [n for n, _, _ in layers[:20]],
                         "count": len(layers), "layer_class": kind, "weight_dtype": dtype,
                         "transformers": transformers.__version__, "see": "config.quantization"}
        self.fix = ("Delete `quantization_config` from config.json (the weights are 16-bit: a merged model saved "
                    "with its 4-bit base's config, unsloth #1601) and diagnose again.")


def unquantized_bitsandbytes_layers(model: nn.Module) -> list[tuple[str, str, str]]:
    """(name, layer class, weight dtype) of every bitsandbytes layer whose weight is still floating point."""
    out = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        weight = getattr(module, "weight", None)
        if kind in BNB_LAYERS and weight is not None and weight.dtype.is_floating_point:
            out.append((name, kind, str(weight.dtype).removeprefix("torch.")))
    return out


def raise_if_declared_quantization_unapplied(model: nn.Module) -> None:
    """DeclaredQuantizationNotApplied when the model's bitsandbytes layers hold floating weights."""
    layers = unquantized_bitsandbytes_layers(model)
    if layers:
        raise DeclaredQuantizationNotApplied(layers)
