"""Gradient checkpointing as transformers set it on a model: on or off, `use_reentrant`, and whether the input-grad
hook is installed (reentrant checkpointing without it sends no gradient into the checkpointed blocks)."""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.model.components import unwrap_model


def checkpointing_state(model: nn.Module) -> dict[str, Any]:
    """Gradient checkpointing as transformers set it: on/off, use_reentrant, and whether the input-grad hook is on."""
    inner, _ = unwrap_model(model)
    func = next((m._gradient_checkpointing_func for m in inner.modules()
                 if getattr(m, "gradient_checkpointing", False) and hasattr(m, "_gradient_checkpointing_func")), None)
    reentrant = getattr(func, "keywords", {}).get("use_reentrant") if func is not None else None
    # transformers names it make_inputs_require_grads, PEFT make_inputs_require_grad; it sits on
    # get_input_embeddings(), or for an encoder-decoder (T5) on each stack's embed_tokens
    hooked = any(getattr(h, "__name__", "").startswith("make_inputs_require_grad")
                 for m in inner.modules() for h in m._forward_hooks.values())
    return {"enabled": func is not None, "use_reentrant": reentrant, "input_grad_hook": hooked}
