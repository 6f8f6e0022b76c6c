"""Training steps that crash in the library's own code, whatever batch they are given: kept as data, each with the
model type, the exception, the transformers file and function that raise it, the condition under which a user's
training raises it too, the versions it was seen on and the upstream reference.

`grad.flow` consults this table when its step raises. A crash whose exception and innermost transformers frame match
a row is the model's (a user's real training step with the same set-up raises the same): `fail`, naming the cause
and the source line read from the live traceback. Any other crash may be our batch or our harness: `error`.

    crash = known_crash(model, exc)   # -> dict (evidence: the row, the live frame, the installed versions) or None

A row is added only after reading the modeling code and confirming that the line runs for every batch (not only
for the workbench's own), as `workbench/architectures/known_incompatibilities.py` records it for the census.
"""

from __future__ import annotations

import dataclasses
import linecache
import types
from typing import Any

from torch import nn

from workbench.model.components import unwrap_model


@dataclasses.dataclass(frozen=True)
class KnownCrash:
    model_type: str  # config.model_type
    message: str  # a substring of str(exception)
    raised_in: str  # the modeling file, relative to transformers/ (the innermost transformers frame)
    function: str  # that frame's function
    condition: str  # when a user's training step raises it
    cause: str  # why, from the modeling code
    seen_on: str  # the versions the row was established on
    reference: str  # upstream issue, or the nearest one
    fix: str  # what to do; {cls}, {module} and {model_class} are filled from the model's own names


KNOWN_CRASHES: tuple[KnownCrash, ...] = (
    KnownCrash(
        model_type="deberta-v2",
        message="value cannot be converted to type c10::BFloat16 without overflow",
        raised_in="models/deberta_v2/modeling_deberta_v2.py",
        function="forward",
        condition="a 4-bit model after prepare_model_for_kbit_training, trained under bf16 autocast "
                  "(TrainingArguments(bf16=True), the QLoRA recipe): every training step, whatever the batch",
        cause="DisentangledSelfAttention.forward fills its attention scores with "
              "`torch.finfo(query_layer.dtype).min` (`attention_scores.masked_fill(~(attention_mask), "
              "torch.finfo(query_layer.dtype).min)`). prepare_model_for_kbit_training casts the embeddings and "
              "LayerNorms to fp32, bitsandbytes' Linear4bit returns its input's dtype and the LoRA update adds in "
              "fp32, so `query_layer` is fp32; under bf16 autocast the scores come out of `torch.bmm` in bf16, and "
              "float32's minimum (-3.40e38) is below bfloat16's (-3.39e38): masked_fill converts "
              "the fill value with a range check before it reads the mask (Scalar::to<BFloat16> in ATen's CPU and "
              "CUDA kernels alike), so every batch raises, whatever its attention mask (checked here on CPU)",
        seen_on="transformers 5.23.0, peft 0.21.2, bitsandbytes 0.50.2, torch 2.13",
        reference="the same dtype assumption as huggingface/transformers#35332",
        fix="Train {model_class} without autocast: TrainingArguments(bf16=False, fp16=False) — the 4-bit layers "
            "still compute in bnb_4bit_compute_dtype (bf16) and the LoRA weights stay fp32 — or fine-tune it "
            "unquantized (no BitsAndBytesConfig) in bf16 with bf16=True. No setting of the adapter helps: the fill "
            "is in {cls} ({module}), transformers' own code."),
)


def _frames(exc: BaseException) -> list[types.FrameType]:
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def raising_frame(exc: BaseException) -> dict[str, Any] | None:
    """The innermost frame of the traceback in transformers' modeling code: file (relative to transformers/),
    line, function, the source line and the module object running it (its `self`), or None."""
    for frame in reversed(_frames(exc)):
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/transformers/models/" not in path:
            continue
        line = exc_line(exc, frame)
        owner = frame.f_locals.get("self")
        return {"file": path.rsplit("/transformers/", 1)[-1], "line": line, "function": frame.f_code.co_name,
                "code": linecache.getline(frame.f_code.co_filename, line).strip(),
                "owner": owner if isinstance(owner, nn.Module) else None}
    return None


def exc_line(exc: BaseException, frame: types.FrameType) -> int:
    """The line the traceback records for `frame` (where the call or the raise happened)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame is frame:
            return tb.tb_lineno
        tb = tb.tb_next
    return frame.f_lineno


def installed_versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "bitsandbytes"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def known_crash(model: nn.Module, exc: BaseException) -> dict[str, Any] | None:
    """The row of KNOWN_CRASHES this exception of a training step matches (model type, message, and the innermost
    transformers frame's file and function), as evidence built from the live traceback; None when none matches."""
    inner, _ = unwrap_model(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    message = str(exc)
    rows = [r for r in KNOWN_CRASHES if r.model_type == model_type and r.message in message]
    if not rows:
        return None
    frame = raising_frame(exc)
    row = next((r for r in rows if frame and frame["file"] == r.raised_in and frame["function"] == r.function), None)
    if row is None or frame is None:
        return None
    owner = frame.pop("owner")
    names = {id(m): n for n, m in model.named_modules()}
    module = names.get(id(owner), "") if owner is not None else ""
    module = module.removeprefix("base_model.model.")
    cls = type(owner).__name__ if owner is not None else row.function
    return {"model_type": model_type, "class": cls, "module": module, "model_class": type(inner).__name__,
            "source": f"{frame['file']}:{frame['line']} ({cls}.{frame['function']})", "code": frame["code"],
            "exception": f"{type(exc).__name__}: {message[:300]}", "condition": row.condition, "cause": row.cause,
            "seen_on": row.seen_on, "installed": installed_versions(), "reference": row.reference,
            "fix": row.fix.format(cls=cls, module=f"`{module}`" if module else "every attention layer",
                                  model_class=type(inner).__name__)}
