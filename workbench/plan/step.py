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
from workbench.plan.fake_model import describe_trainable, on_fake_storage, output_head_names, quantize_4bit
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


def _meta_model(setup):
    """The model on the meta device, wrapped as the set-up wraps it."""
    from transformers import AutoModelForCausalLM

    config = setup.config
    model_class = plannable_class(config)
    notes: list[str] = []
    with torch.device("meta"):
        if model_class is not None:
            model = model_class._from_config(config, dtype=setup.dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=setup.dtype)
    if setup.setup == "qlora":
        from peft import prepare_model_for_kbit_training

        quant = getattr(config, "quantization_config", None) or {}
        quant = quant if isinstance(quant, dict) else quant.to_dict()
        skip = output_head_names(model) | set(quant.get("llm_int8_skip_modules") or [])
        compute = torch.bfloat16 if setup.dtype == torch.float32 else setup.dtype
        replaced = quantize_4bit(model, compute, double_quant=True, skip=skip)
        notes.append(f"{len(replaced)} Linear layers in 4-bit (nf4, double quantization, compute {compute}), "
                     f"{', '.join(sorted(skip))} kept")
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


def _optimizer(setup, model):
    from transformers import Trainer

    params = [p for p in model.parameters() if p.requires_grad]
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(setup.args, model)
    return cls(params, **kwargs), f"{cls.__module__}.{cls.__name__}"


def _autocast(setup, device: str):
    if setup.args.bf16:
        return torch.autocast(device, dtype=torch.bfloat16)
    if setup.args.fp16:
        return torch.autocast(device, dtype=torch.float16)
    return contextlib.nullcontext()


def _inputs(setup, device: str) -> dict[str, torch.Tensor]:
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


LAYER_COUNT = "num_hidden_layers"
SHORT_STACKS = (2, 4)  # the depths a deep homogeneous stack is measured at
# config fields that make a decoder stack non-uniform (a dense prefix before MoE layers, MoE every k-th layer, …):
# with any of them set, the whole depth is run
NON_UNIFORM = ("first_k_dense_replace", "mlp_only_layers", "decoder_sparse_step", "moe_layer_freq",
               "num_dense_layers", "dense_layers", "cross_attention_layers", "full_attn_idxs", "attn_layer_indices")


def uniform_depth(config) -> int | None:
    """The number of identical decoder layers, when every layer is alike (no per-layer list that differs, none of
    NON_UNIFORM set); None otherwise."""
    depth = getattr(config, LAYER_COUNT, None)
    if not isinstance(depth, int) or depth <= max(SHORT_STACKS):
        return None
    for key, value in config.to_dict().items():
        if key in NON_UNIFORM and value not in (None, 0, 1, [], False):
            return None
        if isinstance(value, list) and len(value) == depth and len({str(v) for v in value}) > 1:
            return None
    return depth


def fake_step(setup) -> StepMemory:
    """The memory of the set-up's training steps, on fake tensors (module docstring). A deep stack of identical
    layers (uniform_depth) is measured at 2 and 4 layers and extended to its depth: each figure is affine in the
    number of layers (weights, states and saved activations a layer, the step's peak moment repeating itself), which
    the tests hold against the whole depth: exact on a 90M Qwen2 and a 70B-shaped Llama's peak, within a thousandth
    on a tiny model, where the peak's moment shifts between categories); the CPU's allocator replay is not affine,
    so a CPU plan runs every layer."""
    depth = uniform_depth(setup.config) if setup.device == "cuda" else None
    if depth is None:
        return _stepped(setup)
    import copy

    short = []
    for layers in SHORT_STACKS:
        config = copy.deepcopy(setup.config)
        setattr(config, LAYER_COUNT, layers)
        short.append(_stepped(setup.replace(config=config)))
    (a, b), (ma, mb) = SHORT_STACKS, short

    def at_depth(x: float, y: float) -> int:
        return int(round(x + (y - x) / (b - a) * (depth - a)))

    breakdown = {k: at_depth(ma.breakdown.get(k, 0), mb.breakdown.get(k, 0)) for k in mb.breakdown}
    notes = [*mb.notes, f"{depth} identical layers: measured at {a} and {b} layers and extended to {depth} (every "
                        "figure is affine in the depth); the top modules are those of the 4-layer copy"]
    return StepMemory(at_depth(ma.peak_bytes, mb.peak_bytes), breakdown, mb.phase,
                      at_depth(ma.first_step_peak_bytes, mb.first_step_peak_bytes),
                      at_depth(ma.weights_bytes, mb.weights_bytes), mb.top_modules,
                      at_depth(ma.trainable_parameters, mb.trainable_parameters),
                      at_depth(ma.parameters, mb.parameters), mb.optimizer, ma.seconds + mb.seconds, notes, None,
                      mb.timeline, mb.phase_ends, b)


def _stepped(setup) -> StepMemory:
    """_fake_step, with an operator whose output shape depends on the tensors' values (DeBERTa-v2's
    `nonzero` in its relative positions) refused as NotPlannable: fake tensors hold no values to decide it."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    try:
        return _fake_step(setup)
    except (DynamicOutputShapeException, DataDependentOutputException) as exc:
        name = (getattr(setup.config, "architectures", None) or [type(setup.config).__name__])[0]
        raise NotPlannable(f"{name}'s code runs {exc.func if hasattr(exc, 'func') else exc}, "
                           "an operator whose output shape depends on the tensors' values: fake tensors hold none, "
                           "so its step cannot be planned") from None


def _fake_step(setup) -> StepMemory:
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.monotonic()
    model, notes = _meta_model(setup)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    # a fake CUDA device needs no GPU, but a torch built with CUDA: FakeTensorMode answers for it there; a CPU-only
    # build plans the CUDA step on fake CPU tensors (the CPU's kernels and autocast lists), and says so
    device = "cuda" if setup.device == "cuda" and torch.backends.cuda.is_built() else "cpu"
    if setup.device == "cuda" and device == "cpu":
        notes.append(f"torch {torch.__version__} is a CPU-only build: the CUDA step was planned on fake CPU tensors "
                     "(CPU kernels and autocast lists; CUDA's caching allocator and context are the unseen lines)")
    on_fake_storage(model, fake_mode, device)
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    counts = describe_trainable(model)
    with fake_mode:
        if setup.gradient_checkpointing:
            kwargs = setup.args.gradient_checkpointing_kwargs
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            if getattr(model, "config", None) is not None:
                model.config.use_cache = False
        model.train()
        optimizer, optimizer_name = _optimizer(setup, model)
        inputs = _inputs(setup, device)
        scaler = torch.amp.GradScaler(device, enabled=bool(setup.args.fp16))
        tracker = PeftMemTracker()
        tracker.track_external(model, optimizer)
        first = 0
        with tracker:
            for step in range(STEPS):
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
                    tracker.reset_mod_stats()  # per-module statistics are per iteration; the peak is kept
        breakdown = tracker.breakdown()
    allocator = None
    if setup.device == "cpu":
        allocator = glibc_peak(tracker.trace)
    return StepMemory(breakdown["total"], breakdown, tracker.peak_phase or "", first, weights,
                      tracker.top_modules(), counts["trainable_parameters"], counts["parameters"], optimizer_name,
                      time.monotonic() - start, notes, allocator, tracker.timeline(), list(tracker.phase_ends))
