"""One training step — two, so that the optimizer's states exist during the second forward as in every step of a run
after the first — of the user's model code on fake tensors, as the Trainer runs it: the model built as the set-up
builds it (`fake_model`), gradient checkpointing as `TrainingArguments(gradient_checkpointing=…,
gradient_checkpointing_kwargs=…)` turns it on, the optimizer the installed Trainer picks for `optim`
(`Trainer.get_optimizer_cls_and_kwargs`), the forward and the loss under the autocast of bf16/fp16, backward,
the optimizer step, zero_grad. Its memory is tracked by torch's MemTracker (`tracker.PeftMemTracker`).

    measured = fake_step(setup)          # StepMemory: the peak, its breakdown, the phase, the top modules
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch

from workbench.model.setups import lora_config_for
from workbench.plan.cpu_allocator import glibc_peak
from workbench.plan.depth import extended
from workbench.plan.fake_model import describe_trainable, modules_left_unquantized, on_fake_storage, quantize_4bit
from workbench.plan.setup import NotPlannable, plannable_class
from workbench.plan.tracker import PeftMemTracker

STEPS = 2


@dataclasses.dataclass
class StepMemory:
    peak_bytes: int
    breakdown: dict[str, int]  # bytes per category at the peak
    phase: str  # which phase reached the peak
    first_step_peak_bytes: int
    weights_bytes: int  # parameters + buffers as loaded
    top_modules: list[dict[str, Any]]
    trainable_parameters: int
    parameters: int
    optimizer: str
    seconds: float
    notes: list[str]
    allocator_peak_bytes: int | None = None  # the CPU's resident peak above the weights (glibc replay), device cpu
    timeline: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (event, bytes held) over the steps
    phase_ends: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # (phase, event where it ends)
    timeline_layers: int | None = None  # a deep stack's timeline is its short copy's: its layer count


def build_model(setup, device: str = "meta"):
    """The model on the meta device (or built with random weights on `device`: the real runs the tests hold the plan
    to), wrapped as the set-up wraps it."""
    from transformers import AutoModelForCausalLM

    config = setup.config
    model_class = plannable_class(config)
    notes: list[str] = []
    with torch.device(device):
        if model_class is not None:
            model = model_class._from_config(config, dtype=setup.dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=setup.dtype)
    if setup.setup == "qlora":
        from peft import prepare_model_for_kbit_training

        quant = getattr(config, "quantization_config", None) or {}
        quant = quant if isinstance(quant, dict) else quant.to_dict()
        left_out = modules_left_unquantized(model, quant.get("llm_int8_skip_modules"))
        compute = torch.bfloat16 if setup.dtype == torch.float32 else setup.dtype
        replaced = quantize_4bit(model, compute, double_quant=True, left_out=left_out)
        notes.append(f"{len(replaced)} Linear layers in 4-bit (nf4, double quantization, compute {compute}), "
                     f"{', '.join(left_out)} kept as transformers' bitsandbytes quantizer keeps them")
        model.is_loaded_in_4bit = True
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if setup.peft is not None or setup.setup == "qlora":
        from peft import LoraConfig, get_peft_model

        if setup.peft is not None:
            known = set(LoraConfig.__dataclass_fields__)
            fields = {k: v for k, v in setup.peft.items() if k in known and k not in ("base_model_name_or_path",
                                                                                       "revision")}
            fields["inference_mode"] = False
            config_obj = LoraConfig(**fields)
        else:
            config_obj = lora_config_for(model)
            notes.append(f"a fresh LoRA (r={config_obj.r}) on {sorted(config_obj.target_modules)}: pass --peft for "
                         "yours")
        model = get_peft_model(model, config_obj)
    return model, notes


def trainer_optimizer(setup, model):
    from transformers import Trainer

    params = [p for p in model.parameters() if p.requires_grad]
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(setup.args, model)
    return cls(params, **kwargs), f"{cls.__module__}.{cls.__name__}"


def _autocast(setup, device: str):
    if setup.precision == "bf16":
        return torch.autocast(device, dtype=torch.bfloat16)
    if setup.precision == "fp16":
        return torch.autocast(device, dtype=torch.float16)
    return contextlib.nullcontext()


def training_batch(setup, device: str) -> dict[str, torch.Tensor]:
    """A batch as the Trainer's padding collators give it: with an attention mask, which a fake tensor cannot show
    to be all ones, so the model builds its 4D mask (and, for grouped-query attention, repeats the key/value heads
    for SDPA) as it does for any batch with padding — the largest batches of a run have some. `setup.packed`
    (batches without padding: packing, or every row at max_length) passes no mask, as such a batch lets the model
    skip it."""
    shape = (setup.batch, setup.seq)
    ids = torch.zeros(shape, dtype=torch.long, device=device)
    batch = {"input_ids": ids, "labels": torch.zeros(_label_shape(setup), dtype=torch.long, device=device)}
    if not setup.packed:
        batch["attention_mask"] = torch.ones(shape, dtype=torch.long, device=device)
    return batch


def _label_shape(setup) -> tuple[int, ...]:
    """A sequence classifier's labels are one class a row (transformers' sequence-classification mapping names the
    class); every other head's are a label a token."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    names = set(getattr(setup.config, "architectures", None) or [])
    if names & set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values()):
        return (setup.batch,)
    return (setup.batch, setup.seq)


def fake_step(setup) -> StepMemory:
    """The memory of the set-up's training steps, on fake tensors (module docstring); a deep stack of identical
    layers measured short and extended (`depth.extended`)."""
    return extended(setup, lambda short: value_independent(_fake_step, short))


def value_independent(step, setup) -> StepMemory:
    """`step(setup)` (a fake step), with an operator whose output shape depends on the tensors' values (DeBERTa-v2's
    `nonzero` in its relative positions) refused as NotPlannable: fake tensors hold no values to decide it."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    try:
        return step(setup)
    except (DynamicOutputShapeException, DataDependentOutputException) as exc:
        name = (getattr(setup.config, "architectures", None) or [type(setup.config).__name__])[0]
        raise NotPlannable(f"{name}'s code runs {exc.func if hasattr(exc, 'func') else exc}, "
                           "an operator whose output shape depends on the tensors' values: fake tensors hold none, "
                           "so its step cannot be planned") from None


def prepare_as_the_trainer(setup, model) -> None:
    """What the Trainer does to the model before accelerator.prepare (which shards it): gradient checkpointing
    turned on, and `config.use_cache` set to the training arguments' `use_cache` (default False; transformers 5.23
    trainer.py, "11. Finalize"). A cache built in a training forward is appended to again when activation
    checkpointing recomputes a layer in backward (FSDP's own, fsdp2_apply_ac, included)."""
    if setup.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=setup.args.gradient_checkpointing_kwargs)
    if getattr(model, "config", None) is not None:
        model.config.use_cache = bool(getattr(setup.args, "use_cache", False) and not setup.gradient_checkpointing)


def run_steps(setup, model, optimizer, inputs, tracker, device: str, steps: int = STEPS) -> int:
    """The Trainer's first `steps` training steps under `tracker` (entered by the caller): the forward and the loss under
    the set-up's autocast, backward (through a GradScaler under fp16), the optimizer step, zero_grad; each phase
    marked. Returns the first step's peak."""
    scaler = torch.amp.GradScaler(device, enabled=setup.precision == "fp16")
    first = 0
    for step in range(steps):
        with _autocast(setup, device):
            loss = model(**inputs).loss / setup.args.gradient_accumulation_steps
        tracker.phase(f"forward (step {step + 1})")
        scaler.scale(loss).backward()
        del loss
        tracker.phase(f"backward (step {step + 1})")
        scaler.step(optimizer)
        scaler.update()
        tracker.phase(f"optimizer step (step {step + 1})")
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            first = tracker.breakdown()["total"]
        if step < steps - 1:
            tracker.reset_mod_stats()  # per-module statistics are per iteration (the last step's kept); the peak is kept
    return first


def fake_device(setup, notes: list[str]) -> str:
    """Where the fake tensors live: a fake CUDA device needs no GPU, but a torch built with CUDA (FakeTensorMode
    answers for it there); a CPU-only build plans the CUDA step on fake CPU tensors (the CPU's kernels and autocast
    lists), and says so in `notes`."""
    device = "cuda" if setup.device == "cuda" and torch.backends.cuda.is_built() else "cpu"
    if setup.device == "cuda" and device == "cpu":
        notes.append(f"torch {torch.__version__} is a CPU-only build: the CUDA step was planned on fake CPU tensors "
                     "(CPU kernels and autocast lists; CUDA's caching allocator and context are the unseen lines)")
    return device


def _fake_step(setup) -> StepMemory:
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.monotonic()
    model, notes = build_model(setup)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    device = fake_device(setup, notes)
    on_fake_storage(model, fake_mode, device)
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    counts = describe_trainable(model)
    with fake_mode:
        prepare_as_the_trainer(setup, model)
        model.train()
        optimizer, optimizer_name = trainer_optimizer(setup, model)
        inputs = training_batch(setup, device)
        tracker = PeftMemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            first = run_steps(setup, model, optimizer, inputs, tracker, device)
        breakdown = tracker.breakdown()
    allocator = None
    if setup.device == "cpu":
        allocator = glibc_peak(tracker.trace)
    return StepMemory(breakdown["total"], breakdown, tracker.peak_phase or "", first, weights,
                      tracker.top_modules(), counts["trainable_parameters"], counts["parameters"], optimizer_name,
                      time.monotonic() - start, notes, allocator, tracker.timeline(), list(tracker.phase_ends))
