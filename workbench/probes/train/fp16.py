"""`train.fp16`: what `fp16=True` does to this model before a GPU hour is spent on it.

(a) **Trainable parameters stored in fp16.** Under `fp16=True` the Trainer steps through a `GradScaler`, whose
`unscale_` raises `ValueError: Attempting to unscale FP16 gradients.` (torch/amp/grad_scaler.py) at the first
optimizer step when any gradient is fp16, i.e. when a trainable parameter is. PEFT upcasts its LoRA weights to
fp32, but a `modules_to_save` copy keeps the base's dtype (peft #341: an fp16 model with
`modules_to_save=["lm_head"]` trains `lm_head.modules_to_save.default.weight` in fp16).

(b) **Activation headroom** below fp16's 65504, from one fp32 forward on the batch the forward probes use
(`fp16_headroom`), in the AMP view (fp32 weights under autocast) and the half-weights view (a model stored in fp16),
the residual stream per decoder block as a curve, and vLLM's own list of model types it refuses in fp16. That forward
is the one that accepted the batch where it was fp32 already (every tensor fp32). Where fp16 is not configured and the
model holds no fp16 tensor, the reading is only information, and the accepting forward gives it in the model's own
dtype (bf16 keeps fp32's range): no forward of its own.

Judged only when the configuration sets `fp16=True`: `fail` for a trainable fp16 parameter or an overflow, `warn`
under 4 bits of headroom (or a type vLLM refuses in fp16); otherwise `info` with the same evidence. In the training
callback the run is known (its arguments and its accelerator's mixed precision): without fp16 the headroom is not
read, and the fp32 forward it costs is not run; a diagnosis, whose configuration you may still turn to fp16, gets
the reading.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import torch

from workbench.display.nodes import Display, Figure, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.display.svg_charts import line_svg
from workbench.findings import Finding, combine_findings
from workbench.model.batch import accepted_batch, target_inputs
from workbench.model.components import unwrap_model
from workbench.model.memory import room_for_a_copy
from workbench.probes.train.fp16_headroom import (
    FP16_MAX,
    VLLM_SOURCE,
    WARN_BITS,
    HeadroomReading,
    headroom_of,
    read_headroom,
    vllm_fp16_refusal,
)

CHECK = "train.fp16"
GRADSCALER_MESSAGE = "ValueError: Attempting to unscale FP16 gradients."
GRADSCALER_SOURCE = "torch/amp/grad_scaler.py GradScaler._unscale_grads_"


def _bits(value: float) -> str:
    return "∞" if value == math.inf else ("overflow" if value < 0 else f"{value:.1f} bits")


@dataclasses.dataclass(repr=False)
class Fp16Result(ProbeResult):
    uses_fp16: bool
    fp16_cited: str  # `fp16=... (source)`, as the configuration says it
    stored_dtype: str  # the dtype most trainable parameters are stored in
    fp16_trainable: list[str]  # trainable parameters stored in float16
    modules_to_save: list[str]  # of those, PEFT modules_to_save copies (peft #341)
    reading: HeadroomReading | None
    judged_view: str  # "AMP" (fp32 weights under autocast) or "half weights" (a model stored in fp16)
    vllm: tuple[str, str] | None
    inputs_how: str = ""
    forward_error: str | None = None
    read_from: str = ""  # the forward the reading comes from: its own fp32 one, or the one that accepted the batch

    def _evidence(self) -> dict[str, Any]:
        reading = self.reading
        return {"fp16": self.fp16_cited, "stored_dtype": self.stored_dtype,
                "fp16_trainable": self.fp16_trainable[:40], "fp16_trainable_count": len(self.fp16_trainable),
                "gradscaler": f"{GRADSCALER_MESSAGE} ({GRADSCALER_SOURCE})", "upstream": "huggingface/peft#341",
                "judged_view": self.judged_view, "read_from": self.read_from, "inputs": self.inputs_how,
                "forward_error": self.forward_error,
                "amp_lowest": reading.amp[:10] if reading else [], "half_lowest": reading.half[:10] if reading else [],
                "residual_stream": reading.residual if reading else [],
                "residual_block": reading.block_class if reading else None,
                "vllm_refuses_fp16": ({"model_type": self.vllm[0], "reason": self.vllm[1], "source": VLLM_SOURCE}
                                      if self.vllm else None)}

    def findings(self) -> list[Finding]:
        evidence = self._evidence()
        judged = [self._headroom_finding(evidence)]
        if self.fp16_trainable:
            judged.insert(0, self._trainable_finding(evidence))
        return [combine_findings(judged)]  # one answer: the worse of the two judgements leads

    def _trainable_finding(self, evidence: dict[str, Any]) -> Finding:
        names = self.fp16_trainable
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        why = (" PEFT copies modules_to_save in the base's dtype (peft #341): " + ", ".join(self.modules_to_save[:3])
               + "." if self.modules_to_save else "")
        fix = ("After wrapping (get_peft_model / before building the Trainer), keep trainable parameters in fp32: "
               "for name, param in model.named_parameters():\n    if param.requires_grad:\n"
               "        param.data = param.data.float()\n"
               f"(here: {shown}); or train in bf16 (bf16=True) where the GPU supports it.")
        if self.uses_fp16:
            return Finding(CHECK, "fail", f"{len(names)} trainable parameter(s) stored in fp16 under fp16=True",
                           f"{self.fp16_cited}: GradScaler raises '{GRADSCALER_MESSAGE}' at the first optimizer step "
                           f"on CUDA, because the gradients of {shown} are fp16.{why}", evidence, fix)
        return Finding(CHECK, "info", f"{len(names)} trainable parameter(s) stored in fp16 (fp16 AMP is off)",
                       f"{self.fp16_cited}: no GradScaler runs, so nothing raises; with fp16=True it would raise "
                       f"'{GRADSCALER_MESSAGE}' for {shown}.{why}", evidence, fix)

    def _headroom_finding(self, evidence: dict[str, Any]) -> Finding:
        if self.reading is None and self.forward_error is None:  # not read: see fp16_probe
            vllm = (f" vLLM refuses model type {self.vllm[0]!r} in float16 ('{self.vllm[1]}', {VLLM_SOURCE})."
                    if self.vllm else "")
            return Finding(CHECK, "info", "fp16 is not configured: headroom not read",
                           f"{self.fp16_cited}: the run training now does not use fp16, so the fp32 forward that "
                           f"reads the activations' headroom was not run.{vllm}", evidence,
                           "`workbench diagnose` with `--training-args` naming fp16=True reads it.")
        if self.reading is None:
            return Finding(CHECK, "error", "The fp32 forward for the fp16 headroom did not run",
                           f"{self.forward_error}. The headroom cannot be read from this batch.", evidence,
                           "Diagnose on a machine with that memory free (or on the GPU you train on)."
                           if self.forward_error.startswith("ResourceError") else
                           "Read the exception; pass a batch your training uses (forward_inputs in --params).")
        reading = self.reading
        rows = reading.half if self.judged_view == "half weights" else reading.amp
        low = rows[0] if rows else None
        bits = low["headroom_bits"] if low else math.inf
        where = (f"{low['module']} (|x| up to {low['amax'] if isinstance(low['amax'], str) else format(low['amax'], '.4g')}"
                 f", {_bits(bits)})" if low else "no fp16 tensor")
        other = reading.amp_min if self.judged_view == "half weights" else reading.half_min
        other_view = "AMP" if self.judged_view == "half weights" else "half weights"
        summary = (f"{self.judged_view} view: lowest headroom at {where}; {other_view} view: {_bits(other)}. "
                   f"Read from {self.read_from or 'one fp32 forward'} on {self.inputs_how or 'the sample batch'}.")
        vllm = (f" vLLM refuses model type {self.vllm[0]!r} in float16 ('{self.vllm[1]}', {VLLM_SOURCE})."
                if self.vllm else "")
        fix = ("Train in bf16 (bf16=True) where the GPU supports it; in fp16, keep the modules named here in fp32 "
               "or scale their inputs down.")
        if not self.uses_fp16:
            return Finding(CHECK, "info", f"fp16 headroom {_bits(min(bits, other))} (fp16 is not configured)",
                           f"{self.fp16_cited}: not judged. {summary}{vllm}", evidence)
        if bits < 0:
            return Finding(CHECK, "fail", f"fp16 overflows at {low['module']}",
                           f"{self.fp16_cited}: {summary} Values above {FP16_MAX:g} become inf in fp16: the loss "
                           f"turns NaN and GradScaler skips every step.{vllm}", evidence, fix)
        if bits < WARN_BITS:
            return Finding(CHECK, "warn", f"fp16 headroom only {_bits(bits)} at {low['module']}",
                           f"{self.fp16_cited}: {summary} Under {WARN_BITS:g} bits, longer or other inputs than "
                           f"this batch can overflow.{vllm}", evidence, fix)
        if self.vllm:
            return Finding(CHECK, "warn", f"vLLM refuses {self.vllm[0]} in fp16; this batch has {_bits(bits)}",
                           f"{self.fp16_cited}: {summary}{vllm} Its activations are known to exceed fp16 on real "
                           "inputs; this batch may not show it.", evidence, fix)
        return Finding(CHECK, "pass", f"fp16 headroom {_bits(bits)}, no trainable fp16 parameter",
                       f"{self.fp16_cited}: {summary}", evidence)

    def _points(self) -> tuple[list[tuple[int, float]], str]:
        """(block, headroom bits) per decoder block, a headroom below -1 bit at -1; the x axis' label."""
        rows = self.reading.residual if self.reading else []
        block = self.reading.block_class if self.reading else "-"
        return [(r["layer"], max(r["headroom_bits"], -1)) for r in rows], f"decoder block ({block})"

    def plot(self):
        """The residual stream's fp16 headroom per decoder block, as a matplotlib figure for interactive use (the
        report draws the same as SVG: `chart`)."""
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        points, xlabel = self._points()
        fig = Figure(figsize=(7, 2.6))
        ax = fig.subplots()
        ax.plot([x for x, _ in points], [v for _, v in points], marker="o")
        ax.axhline(WARN_BITS, color="#ef6c00", linestyle="--", linewidth=1, label=f"{WARN_BITS:g} bits")
        ax.axhline(0, color="#c62828", linewidth=1, label="overflow")
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("log2(65504 / max|x|)")
        ax.set_title("fp16 headroom of the residual stream per block", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    def chart(self) -> str:
        """What `plot` draws, as inline SVG (no matplotlib import)."""
        points, xlabel = self._points()
        return line_svg(points, xlabel, "log2(65504 / max|x|)", "fp16 headroom of the residual stream per block",
                        [(WARN_BITS, f"{WARN_BITS:g} bits", "#ef6c00", True), (0, "overflow", "#c62828", False)])

    def details(self):
        if self.reading is None:
            return None
        residual = self.reading.residual
        return Display(
            Figure(self.chart(), "fp16 headroom per decoder block: " + ", ".join(
                f"{r['layer']}: {r['headroom_bits']}" for r in residual[:24])) if residual else None,
            Paragraph("Lowest headroom, AMP view (fp16 products under autocast):"),
            Table.from_records(self.reading.amp[:10]) if self.reading.amp else None,
            Paragraph("Lowest headroom, half-weights view (every module output):"),
            Table.from_records(self.reading.half[:10]) if self.reading.half else None)


def _uses_fp16(config) -> tuple[bool, str]:
    args = getattr(config, "args", None)
    if args is None:
        return False, "fp16=False (no training configuration given: the Trainer's default)"
    value = bool(getattr(args, "fp16", False))
    cite = config.cite("fp16") if hasattr(config, "cite") else f"fp16={value!r}"
    launch = getattr(config, "launch", None)
    if launch is not None and launch.mixed_precision == "fp16" and not value:  # accelerate launch --mixed_precision
        return True, f"{cite}, but the run's accelerator uses mixed_precision='fp16'"
    return value, cite


def _modules_to_save_copies(model, names: list[str]) -> list[str]:
    return [n for n in names if ".modules_to_save." in n]


def _stored_dtype(model) -> torch.dtype:
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.dtype.is_floating_point:
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def _fp32_forward(model, inputs: dict, block_names: set[str]) -> HeadroomReading:
    """The forward in fp32, one module at a time: each module's own floating parameters and buffers are cast to
    fp32 when its forward starts and put back when it ends, so the extra memory is about one module's fp32 copy. A
    cast of the whole model held fp32 copies of every weight beside the originals: 3.5× a bf16 checkpoint at peak.
    A model whose forward reads a weight outside its module's own forward (a mismatch the per-module cast makes)
    gets the whole-model cast."""
    inputs = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    try:
        with _cast_per_module(model):
            return read_headroom(model, inputs, block_names)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:
        with _cast_whole_model(model):
            return read_headroom(model, inputs, block_names)


def _off_fp32(tensors) -> list[torch.Tensor]:
    return [t for t in tensors if t.dtype.is_floating_point and t.dtype != torch.float32]


@contextlib.contextmanager
def _cast_per_module(model):
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def own(module) -> list[torch.Tensor]:
        return _off_fp32([*module.parameters(recurse=False), *module.buffers(recurse=False)])

    def cast(module, _args):
        for t in own(module):
            if id(t) not in saved:
                saved[id(t)] = (t, t.data)
                t.data = t.data.float()

    def restore(module, _args, _out):
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if id(t) in saved:
                t.data = saved.pop(id(t))[1]

    handles = []
    for module in model.modules():
        if own(module):
            handles.append(module.register_forward_pre_hook(cast))
            handles.append(module.register_forward_hook(restore, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for t, data in saved.values():
            t.data = data


@contextlib.contextmanager
def _cast_whole_model(model):
    """Every weight and buffer not in fp32 cast to fp32 for the forward, put back after; ResourceError (the probe's
    `error`, saying both numbers) where those fp32 copies would take more than half the free memory."""
    saved = [(t, t.data) for t in _off_fp32([*model.parameters(), *model.buffers()])]
    room_for_a_copy([t for t, _ in saved], f"an fp32 copy of {len(saved)} weights and buffers, which", element_size=4)
    try:
        for t, data in saved:
            t.data = data.float()
        yield
    finally:
        for t, data in saved:
            t.data = data


def _reading_without_a_forward(model, target, uses_fp16: bool, block_names: set[str]) -> tuple[
        HeadroomReading | None, str]:
    """The headroom from the forward that accepted the batch (`workbench.model.batch`), where that forward says
    what an fp32 forward would: every floating tensor fp32 (it was one), or fp16 not configured and nothing in fp16
    (a bf16 forward, within bf16's rounding of the fp32 one and with its range: the reading is only information).
    (None, "") where the fp32 forward must run."""
    peaks = accepted_batch(model, target).peaks  # the batch was accepted just before: no forward here
    if peaks is None:
        return None, ""
    floating = {t.dtype for t in [*model.parameters(), *model.buffers()] if t.dtype.is_floating_point}
    if floating <= {torch.float32}:
        return headroom_of(model, peaks, block_names), "the fp32 forward that accepted the batch"
    if not uses_fp16 and torch.float16 not in floating:
        dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in floating))
        return headroom_of(model, peaks, block_names), (
            f"the forward that accepted the batch, in the model's own dtypes ({dtypes}; fp16 is not configured, so "
            "no fp32 forward was run for this information)")
    return None, ""


def fp16_probe(prepared, target, config) -> Fp16Result:
    model = prepared.model
    uses_fp16, cited = _uses_fp16(config)
    fp16_trainable = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
    stored = _stored_dtype(model)
    judged_view = "half weights" if stored == torch.float16 else "AMP"
    inner, _ = unwrap_model(model)
    block_names = set(getattr(inner, "_no_split_modules", None) or ())
    refusal = vllm_fp16_refusal(getattr(inner, "config", None))
    reading, error, how, read_from = None, None, "", ""
    if uses_fp16 or getattr(config, "launch", None) is None:
        inputs, how = target_inputs(model, target)  # BatchNotAccepted: an `error`, said by the caller
        reading, read_from = _reading_without_a_forward(model, target, uses_fp16, block_names)
        if reading is None:
            read_from = "one fp32 forward"
            try:
                reading = _fp32_forward(model, inputs, block_names)
            except Exception as exc:  # noqa: BLE001 - the failure is the evidence
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return Fp16Result(uses_fp16, cited, str(stored).removeprefix("torch."), fp16_trainable,
                      _modules_to_save_copies(model, fp16_trainable), reading, judged_view, refusal, how, error,
                      read_from)
