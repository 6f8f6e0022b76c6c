"""Set-ups: how the model is prepared before the probes look at it.

A set-up is a callable `fn(checkpoint=PATH, **options) -> model | (model, processor)` that prepares the model
exactly as a training script does. Built-ins cover the common cases; `--setup my_pkg.train:load_model` runs the
user's own `load_model_for_recipe()`. Options passed: adapter, quant, dtype, device_map, max_memory,
trust_remote_code, allow_pickle, data (the --data path or None; a user set-up may ignore them, hence **options).
A set-up may also return its `transformers.Trainer` (or trl `SFTTrainer`): the probes then look at `trainer.model`,
and notebook 07 reads the batches from the Trainer's own train_dataset, data_collator and get_train_dataloader().
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.display.nodes import Code, Display, Paragraph
from workbench.display.result import Displayable
from workbench.errors import NotApplicable, UsageError
from workbench.model.bnb_cpu_layout import keep_training_layout, packed_for_cpu_inference
from workbench.model.heads import DESCRIPTIONS, PEFT_TASK_TYPES, head_kind, head_of_class
from workbench.model.loading import auto_config, load_pretrained, load_processor, model_class_for, parse_dtype
from workbench.model.memory import check_fits
from workbench.model.trainer_attributes import snapshot

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# PeftModelForSequenceClassification / ...TokenClassification add these to modules_to_save (peft 0.21.2
# peft_model.py:1830 and :2680), and `_set_trainable` (peft/utils/other.py:1088) wraps every module whose name merely
# ends with one (`key.endswith(target_key)`, no dot boundary: DistilBERT's `pre_classifier` too), while LoRA's own
# guard (tuners_utils.py:2363) matches them at a dot boundary only; a LoRA layer there then raises "modules_to_save
# cannot be applied to modules of type lora.Linear". Those modules, and the layers inside them (RoBERTa's
# classifier.dense, which the guard leaves out), are trained fully, never given a LoRA.
HEAD_MODULES_TO_SAVE = {"SEQ_CLS": ("classifier", "score"), "TOKEN_CLS": ("classifier", "score")}


def _refused_by_peft(config, model, leaf_name: str) -> str | None:
    """PEFT's own refusal of a LoRA target by name (Mamba's out_proj / conv1d), as its inject_adapter raises it."""
    from peft.tuners import tuners_utils

    check = getattr(tuners_utils, "_check_lora_target_modules_mamba", None)
    if check is None:
        return None
    try:
        check(config, model, leaf_name)
    except ValueError as exc:
        return str(exc)
    return None


def lora_targets(model, task_type: str | None) -> list[str]:
    """The modules a fresh LoRA adapts, as PEFT itself resolves them: the layers its "all-linear" shorthand finds
    (nn.Linear, bitsandbytes' 4/8-bit Linear, GPT-2's Conv1D; the output embedding and a SEQ_CLS head left out),
    less those PEFT refuses to wrap for this model (Mamba's out_proj), less the modules the task's
    modules_to_save trains fully (HEAD_MODULES_TO_SAVE); of those, the attention/MLP projections q_proj ... down_proj
    where the model names them (the usual LLM LoRA targets), else all. Returned as the shortest name suffixes that
    reach exactly those modules (PEFT's `_find_minimal_target_modules`). Raises NotApplicable when nothing is left:
    PEFT cannot adapt the model."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _find_minimal_target_modules, _maybe_include_all_linear_layers

    unreadable = _tied_embeddings_unreadable(model)
    if unreadable:
        name = type(model).__name__
        raise NotApplicable(
            f"PEFT cannot wrap {name}: get_peft_model reads get_input_embeddings() to find the modules tied to it "
            f"(peft 0.21.2 utils/other.py:1815, as the model declares _tied_weights_keys), and {name} raises "
            f"({unreadable}). Diagnose it with --setup plain.", title=f"PEFT cannot put a LoRA on {name}")
    probe = LoraConfig(target_modules="all-linear", task_type=task_type)
    linear = set(_maybe_include_all_linear_layers(probe, model).target_modules)
    to_save = HEAD_MODULES_TO_SAVE.get(task_type or "", ())
    refused = {name: why for name in linear if (why := _refused_by_peft(probe, model, name.rsplit(".", 1)[-1]))}
    wrappable = {name for name in linear - set(refused) if not _trained_fully(name, to_save)}
    usual = {name for name in wrappable if name.rsplit(".", 1)[-1] in LORA_TARGETS}
    chosen = usual or wrappable
    if not chosen:
        raise lora_not_applicable(model, refused, to_save)
    others = {name for name, _ in model.named_modules() if name and name not in chosen}
    return sorted(_find_minimal_target_modules(chosen, others))


def _tied_embeddings_unreadable(model) -> str | None:
    """The NotImplementedError of get_input_embeddings() where PEFT needs it: a model that declares tied weights
    (`_tied_weights_keys` as a dict, tie_word_embeddings not False: peft 0.21.2 utils/other.py:1780-1795)."""
    if getattr(getattr(model, "config", None), "tie_word_embeddings", None) is False:
        return None
    if not isinstance(getattr(model, "_tied_weights_keys", None), dict):
        return None
    try:
        model.get_input_embeddings()
    except NotImplementedError as exc:
        return str(exc)
    return None


def _trained_fully(name: str, modules_to_save) -> bool:
    """A module PEFT's modules_to_save wraps (`_set_trainable`'s suffix rule) or one inside such a module."""
    return any(name.endswith(m) or m in name.split(".") for m in modules_to_save)


def lora_not_applicable(model, refused: dict[str, str], modules_to_save=()) -> NotApplicable:
    """PEFT cannot put a LoRA on this model: what it has instead, and what PEFT said."""
    weighted = sorted({type(m).__name__ for n, m in model.named_modules()
                       if any(True for _ in m.parameters(recurse=False)) and not _trained_fully(n, modules_to_save)})
    head = f" outside the {'/'.join(modules_to_save)} head PEFT trains fully" if modules_to_save else ""
    cause = (f"PEFT refuses the linear layers it has ({next(iter(refused.values()))})" if refused else
             "PEFT's LoRA wraps torch.nn.Linear, Embedding, Conv1d/2d/3d, MultiheadAttention and transformers' "
             f"Conv1D layers, and its layers with weights{head} are {', '.join(weighted[:8])}")
    name = type(model).__name__
    return NotApplicable(f"{name} has no layer a LoRA can adapt: {cause}. Diagnose it with --setup plain, or with "
                         "your own set-up (--setup module:function) that prepares it as your training script does.",
                         title=f"PEFT cannot put a LoRA on {name}")


def lora_config_for(model, **overrides):
    """The LoraConfig a fresh LoRA on this model takes: the PEFT task type that fits its head
    (workbench.model.heads: CAUSAL_LM, SEQ_2_SEQ_LM, SEQ_CLS, TOKEN_CLS, FEATURE_EXTRACTION) on `lora_targets`
    (raises NotApplicable where PEFT can adapt nothing); the classification head is trained fully through PEFT's
    modules_to_save."""
    from peft import LoraConfig

    options: dict[str, Any] = dict(r=8, lora_alpha=16, task_type=PEFT_TASK_TYPES[head_kind(model)])
    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        # a speech model (input_features): PeftModelForSeq2SeqLM passes input_ids on to the decoder, which then
        # gets it twice (peft #1988); PEFT's own Whisper examples set no task type
        options["task_type"] = None
    options.update(overrides)
    if "target_modules" not in overrides:
        options["target_modules"] = lora_targets(model, options["task_type"])
    elif "exclude_modules" not in overrides:  # given targets ("all-linear"): still none inside the trained head
        to_save = HEAD_MODULES_TO_SAVE.get(options["task_type"] or "", ())
        options["exclude_modules"] = sorted(n for n, _ in model.named_modules() if n and _trained_fully(n, to_save))
        options["exclude_modules"] = options["exclude_modules"] or None
    return LoraConfig(**options)


def add_fresh_lora(model):
    """A fresh LoRA that fits the model's head and names its layers (`lora_config_for`)."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config_for(model))


def prepare_for_kbit_training(model):
    """peft's prepare_model_for_kbit_training as a correct QLoRA script calls it: gradient checkpointing where the
    class supports it (peft's default, True, raises "does not support activation checkpointing" for the classes
    that set supports_gradient_checkpointing = False: ALBERT, BROS, ...), and non-reentrant.

    Left to itself, peft 0.21.2 passes gradient_checkpointing_kwargs={} (peft/utils/other.py:190-191, 253-258) and
    transformers 5.23 applies its own use_reentrant=False default only when given None (modeling_utils.py:3148),
    so torch runs the checkpoint REENTRANT (torch/utils/checkpoint.py:486-496: use_reentrant None -> True). peft
    then makes only the input embeddings' output require grad (other.py:230-233, enable_input_require_grads), so
    the checkpointed blocks of a vision or speech tower get inputs without grad and their LoRA gets no gradient;
    and on BLIP that hook turns the text embeddings' output into a leaf its `embeddings += position_embeddings`
    cannot update in place. use_reentrant=False needs no hook (other.py:230); transformers still installs it on
    models whose main input is input_ids (modeling_utils.py:3181-3189)."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=bool(getattr(model, "supports_gradient_checkpointing", False)),
        gradient_checkpointing_kwargs={"use_reentrant": False})


def _load(checkpoint, quant="none", dtype=None, device_map=None, max_memory=None, trust_remote_code=False,
          allow_pickle=False, **_):
    return load_pretrained(checkpoint, quant=quant, dtype=parse_dtype(dtype), device_map=device_map,
                           max_memory=max_memory, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)


def plain(checkpoint: str, adapter: str | None = None, **options: Any):
    """from_pretrained (quantized if asked), the adapter loaded for inference on top: an evaluation set-up."""
    model = _load(checkpoint, **options)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model


# the qlora set-up's wrapping steps, snapshotted as it runs them (its model -> the snapshots): they are notebook
# 03's wrapping chain, which reads them instead of walking the chain again on a load of its own
WRAPPING_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def qlora(checkpoint: str, adapter: str | None = None, quant: str = "4bit", **options: Any):
    """The QLoRA recipe: 4-bit load, peft's prepare_model_for_kbit_training (`prepare_for_kbit_training`:
    non-reentrant gradient checkpointing), then the given adapter, trainable, or a fresh LoRA (`lora_config_for`).
    Each step's Trainer-read attributes are snapshotted as it runs (`WRAPPING_STEPS`)."""
    from peft import PeftModel

    model = _load(checkpoint, quant="4bit" if quant == "none" else quant, **options)
    steps = [snapshot("raw model", model)]
    model = prepare_for_kbit_training(model)
    steps.append(snapshot("prepare_model_for_kbit_training", model))
    if adapter:
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        steps.append(snapshot("PeftModel.from_pretrained", model))
    else:
        model = add_fresh_lora(model)
        steps.append(snapshot("get_peft_model", model))
    WRAPPING_STEPS[model] = steps
    return model


def legacy_trl_bf16_casting(model):
    """What older trl SFTTrainer releases did to a 4-bit PEFT model with bf16=True, via
    `trl.trainer.utils.peft_module_casting_to_bf16` (2024-era runs: docs/demo.md): adapter layers to bf16, every module
    named *norm* (or a LayerNorm) to fp32, lm_head / embed_tokens / wte / wpe from fp32 to bf16. trl 1.16 no
    longer does this (it casts only trainable adapter weights to bf16). Encoded here to reproduce such runs."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            module.to(torch.bfloat16)
        elif isinstance(module, torch.nn.LayerNorm) or "norm" in name:
            module.to(torch.float32)
        elif any(x in name for x in ["lm_head", "embed_tokens", "wte", "wpe"]):
            if hasattr(module, "weight") and module.weight.dtype == torch.float32:
                module.to(torch.bfloat16)
    return model


def qlora_trl_legacy(checkpoint: str, adapter: str | None = None, quant: str = "4bit", **options: Any):
    """QLoRA as a 2024-era trl SFTTrainer prepared it: `qlora`, then older trl's bf16 casting
    (fp32 norms, bf16 lm_head) — the configuration whose DataParallel replicas raise float != BFloat16."""
    return legacy_trl_bf16_casting(qlora(checkpoint, adapter=adapter, quant=quant, **options))


SFT_HEADS = ("causal_lm", "image_text_to_text")  # what trl's SFTTrainer builds: AutoModelFor{CausalLM,ImageTextToText}


def sft_not_applicable(model_class: str, head: str) -> NotApplicable:
    return NotApplicable(
        f"the sft set-up builds trl's SFTTrainer, which trains causal LMs (and image-text-to-text models): this "
        f"checkpoint is {model_class} — {DESCRIPTIONS.get(head, head)}. Diagnose it with --setup plain, or with your "
        "own set-up (--setup module:function) that prepares it as your training script does (a transformers "
        "Trainer for a classifier or an encoder, Seq2SeqTrainer for an encoder-decoder).",
        title=f"The sft set-up does not apply to {model_class} ({DESCRIPTIONS.get(head, head)})")


def sft(checkpoint: str, adapter: str | None = None, quant: str = "none", **options: Any):
    """What trl's SFTTrainer hands its training loop: a real SFTTrainer is constructed on a one-row dataset and
    its `.model` returned, so trl's own PEFT / k-bit / gradient-checkpointing preparation is what runs. Another head
    than SFTTrainer's (a classifier, an encoder, T5) raises NotApplicable: the checks that need the model say skip."""
    import tempfile

    from datasets import Dataset
    from peft import PeftModel
    from trl import SFTConfig, SFTTrainer

    model_class = model_class_for(auto_config(checkpoint, trust_remote_code=options.get("trust_remote_code", False)))
    head = head_of_class(model_class)  # None for remote code: read from the loaded model below
    if head is not None and head not in SFT_HEADS:
        raise sft_not_applicable(model_class.__name__, head)
    model = _load(checkpoint, quant=quant, **options)
    if head is None and head_kind(model) not in SFT_HEADS:
        raise sft_not_applicable(type(model).__name__, head_kind(model))
    processing = load_processor(checkpoint)
    tokenizer = getattr(processing, "tokenizer", processing)
    if tokenizer is None:
        raise UsageError(f"the sft set-up needs a tokenizer saved in {checkpoint}")
    peft_config = None
    if adapter:
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    else:
        peft_config = lora_config_for(model)
    bf16 = any(p.dtype == torch.bfloat16 for p in model.parameters())
    with tempfile.TemporaryDirectory(prefix="workbench-sft-") as out:
        args = SFTConfig(output_dir=out, report_to=[], bf16=bf16, use_cpu=not torch.cuda.is_available(),
                         gradient_checkpointing=True, max_length=32, per_device_train_batch_size=1,
                         dataset_text_field="text")
        trainer = SFTTrainer(model=model, args=args, processing_class=tokenizer, peft_config=peft_config,
                             train_dataset=Dataset.from_dict({"text": ["hello world"]}))
        return trainer.model


BUILTIN_SETUPS: dict[str, Callable[..., Any]] = {"plain": plain, "qlora": qlora, "qlora_trl_legacy": qlora_trl_legacy,
                                                 "sft": sft}


def resolve_setup(spec: str | None) -> Callable[..., Any]:
    """'plain' | 'qlora' | 'sft' | 'package.module:function' (the cwd is importable, like `python -m`)."""
    spec = spec or "plain"
    if spec in BUILTIN_SETUPS:
        return BUILTIN_SETUPS[spec]
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"--setup {spec!r}: use one of {', '.join(BUILTIN_SETUPS)} or module:function")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - ImportError or an error raised while importing the user's module
        raise UsageError(f"--setup {spec!r}: cannot import {module_name} ({type(exc).__name__}: {exc}); "
                         "check the module is on PYTHONPATH or in the current folder") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"--setup {spec!r}: {module_name} has no callable {func_name!r}")
    return func


@dataclasses.dataclass(repr=False)
class PreparedModel(Displayable):
    """The model the probes look at, as the set-up returned it, plus its processor (or tokenizer)."""

    model: Any
    processor: Any
    setup: str
    description: str
    trainer: Any = None  # the Trainer the set-up returned, if it returned one
    # 4-bit layers the set-up returned in bitsandbytes' CPU inference layout (an eval forward without grad ran in
    # it): a training step on them sends no gradient back. Unpacked before any probe runs; grad.flow names them.
    packed_at_setup: list[str] = dataclasses.field(default_factory=list)
    launch: Any = None  # how the training running now was launched (a RunLaunch, from the training callback)

    def view(self):
        return Display(Paragraph("Set-up ", Code(self.setup), ": ", self.description))


def prepare_model(target) -> PreparedModel:
    """Run the target's set-up and return what it prepared."""
    func = resolve_setup(target.setup)
    if not target.device_map:  # an explicit device map may offload what does not fit
        check_fits(target)
    options = dict(adapter=str(target.adapter_dir) if target.adapter_dir else None, quant=target.quant,
                   dtype=target.dtype, device_map=target.device_map, max_memory=target.max_memory,
                   trust_remote_code=target.trust_remote_code, allow_pickle=target.allow_pickle,
                   data=getattr(target, "data", None))
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(func).parameters.values())
    if not accepts_any:
        allowed = set(inspect.signature(func).parameters)
        options = {k: v for k, v in options.items() if k in allowed}
    returned = func(checkpoint=str(target.model_dir), **options)
    model, processor = (returned if isinstance(returned, tuple) else (returned, None))
    trainer = None
    if is_trainer(model):
        trainer, model = model, model.model
        processor = processor or getattr(trainer, "processing_class", None)
    if processor is None:
        processor = load_processor(target.model_dir)
    packed_at_setup = packed_for_cpu_inference(model)
    keep_training_layout(model)
    n_params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    description = (f"{type(model).__name__} with {n_params:,} parameter elements ({trainable:,} trainable), "
                   f"quantization {target.quant}, processor {type(processor).__name__ if processor else 'none'}")
    if trainer is not None:
        description += f", inside the {type(trainer).__name__} your set-up returned"
    return PreparedModel(model, processor, target.setup, description, trainer, packed_at_setup)


def is_trainer(obj: Any) -> bool:
    """A transformers.Trainer (trl's trainers derive from it) or anything shaped like one. transformers.trainer is
    not imported for the question (2 s): no Trainer exists unless its module was imported."""
    trainer_class = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
    return ((trainer_class is not None and isinstance(obj, trainer_class))
            or (hasattr(obj, "get_train_dataloader") and hasattr(obj, "data_collator")
                and isinstance(getattr(obj, "model", None), torch.nn.Module)))
