"""train.loss_accumulation: does gradient accumulation change the loss the Trainer optimises?

The real Trainer (the class the set-up returned, else `transformers.Trainer`) runs one optimizer step twice on the
user's model class, `learning_rate=0`, on the same rows: A = one batch of b·k rows, GA 1; B = k batches of b rows,
GA k. The logged `loss` and `grad_norm` of B against A:

- equal (within 1e-4): the Trainer's arithmetic is exact for this model;
- ≈ k: inflated. The model's forward takes `**kwargs` (so the Trainer passes `num_items_in_batch` and skips its
  division by GA) but never hands them to its loss: each micro-batch's mean is summed k times (transformers #47688:
  `GenericForSequenceClassification` / `GenericForTokenClassification`);
- anything else: a mean of micro-batch means, not token-weighted (`accepts_loss_kwargs = False`, #37766).

The model is the user's own when it is small and not offloaded (a copy, in fp32), else a tiny twin: the same class
from the same config, every size shrunk (`workbench.architectures.tiny_config.shrunk_fields`); an
`accepts_loss_kwargs` the user set on the model is carried over, so the fix is measured too. An offloaded model
(meta tensors, which accelerate refuses to move) always runs as its twin. A copy with nothing trainable (an adapter
loaded for inference, a frozen model) gets its adapter, else every parameter, made trainable: the Trainer's step
ends in a backward, and the loss it logs does not depend on which parameters train. Rows: fixed length, no padding; the label tokens
masked (-100) in a different number per row, so micro-batches hold different numbers of supervised tokens.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import tempfile
import textwrap
from typing import Any

from workbench.display.nodes import Code, Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.errors import NotApplicable
from workbench.findings import Finding
from workbench.probes.train.configuration import HOW_TO_GIVE, gpu_configuration

CHECK = "train.loss_accumulation"
TOLERANCE = 1e-4  # relative: fp32 sums in another order stay within ~1e-6
INFLATION_TOLERANCE = 0.02  # a ratio within 2 % of k is the ×k inflation
PROBE_ACCUMULATION = 4  # k when the configuration does not accumulate
MICRO_BATCH = 2  # b
SEQUENCE = 16
REAL_MODEL_MAX_ELEMENTS = 5_000_000  # the user's model itself runs the two steps at or below this size
HEADS_WITH_LABELS = ("causal_lm", "image_text_to_text", "seq2seq_lm", "seq_cls", "token_cls")  # a VLM: text rows
ISSUE_INFLATION = "transformers #47688"
ISSUE_UNWEIGHTED = "transformers #37766"


@dataclasses.dataclass(repr=False)
class LossAccumulationResult(ProbeResult):
    model_class: str
    model_source: str  # "your model (a copy)" | "a tiny twin ..."
    trainer_class: str
    trainer_note: str | None
    configured_accumulation: int
    accumulation: int  # k measured
    micro_batch: int  # b
    loss_a: float
    loss_b: float
    grad_norm_a: float
    grad_norm_b: float
    accepts_loss_kwargs: bool  # the Trainer's model_accepts_loss_kwargs for this model
    forward_takes_kwargs: bool
    forward_passes_kwargs_to_loss: bool | None  # None: forward's source not readable
    configuration_source: str
    peft_wrapped: bool
    versions: dict[str, str]

    @property
    def loss_ratio(self) -> float:
        return self.loss_b / self.loss_a if self.loss_a else float("nan")

    @property
    def grad_ratio(self) -> float:
        """B's grad_norm over A's; 1 when neither step reached a trainable tensor (the loss ratio then decides)."""
        if self.grad_norm_a == 0 and self.grad_norm_b == 0:
            return 1.0
        return self.grad_norm_b / self.grad_norm_a if self.grad_norm_a else float("nan")

    @property
    def outcome(self) -> str:
        """'equal' | 'inflated' | 'unweighted'."""
        if abs(self.loss_ratio - 1) <= TOLERANCE and abs(self.grad_ratio - 1) <= TOLERANCE:
            return "equal"
        k = self.accumulation
        if abs(self.loss_ratio - k) <= INFLATION_TOLERANCE * k:
            return "inflated"
        return "unweighted"

    def _evidence(self) -> dict[str, Any]:
        return {"model_class": self.model_class, "model": self.model_source, "trainer": self.trainer_class,
                "configuration": self.configuration_source, "gradient_accumulation_steps": self.configured_accumulation,
                "A": f"batch {self.micro_batch * self.accumulation} x GA 1",
                "B": f"batch {self.micro_batch} x GA {self.accumulation}",
                "loss_A": self.loss_a, "loss_B": self.loss_b, "loss_ratio": round(self.loss_ratio, 6),
                "grad_norm_A": self.grad_norm_a, "grad_norm_B": self.grad_norm_b,
                "grad_norm_ratio": round(self.grad_ratio, 6),
                "model_accepts_loss_kwargs": self.accepts_loss_kwargs,
                "forward_takes_kwargs": self.forward_takes_kwargs,
                "forward_passes_kwargs_to_loss": self.forward_passes_kwargs_to_loss,
                **({"trainer_note": self.trainer_note} if self.trainer_note else {}), **self.versions}

    def _kwargs_sentence(self) -> str:
        takes = "takes **kwargs" if self.forward_takes_kwargs else "takes no **kwargs"
        if self.forward_passes_kwargs_to_loss is None:
            passes = "its source could not be read"
        else:
            passes = ("passes them to its loss" if self.forward_passes_kwargs_to_loss
                      else "never passes them to its loss")
        return f"{self.model_class}.forward {takes} and {passes}"

    def findings(self) -> list[Finding]:
        k, b = self.accumulation, self.micro_batch
        measured = (f"{self.trainer_class}, learning_rate=0, on {self.model_source}: batch {b * k} × GA 1 logs loss "
                    f"{self.loss_a:.6g} (grad_norm {self.grad_norm_a:.6g}), batch {b} × GA {k} logs "
                    f"{self.loss_b:.6g} (grad_norm {self.grad_norm_b:.6g}): ratio {self.loss_ratio:.4g}. "
                    f"{self._kwargs_sentence()}; the Trainer's model_accepts_loss_kwargs is {self.accepts_loss_kwargs}.")
        configured = self.configured_accumulation
        target = "model.get_base_model()" if self.peft_wrapped else "model"
        if self.outcome == "equal":
            return [Finding(CHECK, "pass", "Gradient accumulation leaves the loss unchanged",
                            measured + f" Configuration: {self.configuration_source}.", self._evidence())]
        if self.outcome == "inflated":
            fix = (f"set `{target}.accepts_loss_kwargs = False` on your {self.model_class} before building the "
                   f"Trainer: it then divides each micro-batch's loss by gradient_accumulation_steps (the "
                   f"mechanism of {ISSUE_INFLATION}); or pass a `compute_loss_func` that divides by `num_items_in_batch`")
            if configured > 1:
                verdict, title = "fail", f"Gradient accumulation inflates the loss ×{k}"
                why = f" Your configuration accumulates {configured} steps: every loss and gradient is ×{k}."
            elif self.configuration_source == "defaults":
                verdict, title = "info", f"Gradient accumulation would inflate the loss ×{k}; the defaults do not accumulate"
                why = (" No configuration was given (the Trainer's defaults, GA 1, are unaffected): a run that "
                       f"accumulates k steps logs and optimises k× the loss. Give yours: {HOW_TO_GIVE}.")
            else:
                verdict, title = "info", f"Gradient accumulation would inflate the loss ×{k}; yours does not accumulate"
                why = " Your configuration uses GA 1: unaffected unless you accumulate."
            return [Finding(CHECK, verdict, title, measured + why, self._evidence(), fix)]
        fix = ("pass `compute_loss_func=lambda outputs, labels, num_items_in_batch: ...` summing the token losses and "
               f"dividing by num_items_in_batch ({ISSUE_UNWEIGHTED}), or leave it: each micro-batch weighs the same "
               "whatever its number of supervised tokens")
        verdict = "warn" if configured > 1 else "info"
        title = ("Gradient accumulation averages micro-batch means, not tokens" if configured > 1
                 else "Accumulation would average micro-batch means; yours does not accumulate")
        return [Finding(CHECK, verdict, title, measured + " Not token-weighted: micro-batches with fewer supervised "
                        "tokens weigh as much as full ones.", self._evidence(), fix)]

    def details(self):
        k, b = self.accumulation, self.micro_batch
        rows = [[f"A: batch {b * k} × GA 1", f"{self.loss_a:.6g}", f"{self.grad_norm_a:.6g}"],
                [f"B: batch {b} × GA {k}", f"{self.loss_b:.6g}", f"{self.grad_norm_b:.6g}"],
                ["B / A", f"{self.loss_ratio:.6g}", f"{self.grad_ratio:.6g}"]]
        return Display(Table(["run", "logged loss", "grad_norm"], rows, left=True),
                       Paragraph(Code(self.trainer_class), " on ", self.model_source, ". ", self._kwargs_sentence(),
                                 "."))


def _passes_kwargs_to_loss(cls: type) -> bool | None:
    """Whether `cls.forward` hands `**kwargs` to a loss call (`self.loss_function(..., **kwargs)`, `loss_fct`):
    read from the forward's own source; None when it cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(cls.forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if "loss" in name.lower() and any(kw.arg is None for kw in node.keywords):
            return True
    return False


def config_token_ids(config) -> list[int]:
    ids = []
    for key, value in config.to_dict().items():
        if key.endswith("token_id") and isinstance(value, int) and value >= 0:
            ids.append(value)
    return ids


def _merged(full: dict[str, Any], shrunk: dict[str, Any]) -> dict[str, Any]:
    """The config's own fields with the shrunk ones on top, sub-configs merged field by field."""
    out = dict(full)
    for key, value in shrunk.items():
        out[key] = _merged(full[key], value) if isinstance(value, dict) and isinstance(full.get(key), dict) else value
    return out


def tiny_twin(model):
    """The same class from the same config, every size shrunk, in fp32; the user's `accepts_loss_kwargs` kept.
    Marked a stand-in: its forwards are not counted as passes over the model's weights (`model.passes`)."""
    import torch

    from workbench.architectures.tiny_config import VOCAB, shrunk_fields
    from workbench.model.passes import mark_stand_in

    config = model.config
    vocab = max([VOCAB, *[i + 1 for i in config_token_ids(config)]])
    fields = _merged(config.to_dict(), shrunk_fields(config, vocab))
    fields.pop("quantization_config", None)
    fields["dtype"] = "float32"
    twin_config = type(config)(**fields)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        twin = type(model)(twin_config).float()
    return mark_stand_in(twin)


def _model_for_runs(model) -> tuple[Any, str]:
    from workbench.model.components import unwrap_model
    from workbench.model.offload import offload_sentence, offloaded_parameters

    inner, _ = unwrap_model(model)
    elements = sum(p.numel() for p in model.parameters())
    quantized = any(getattr(inner, a, False) for a in ("is_loaded_in_4bit", "is_loaded_in_8bit", "is_quantized"))
    offloaded = offloaded_parameters(model)
    if elements <= REAL_MODEL_MAX_ELEMENTS and not quantized and not offloaded:
        runner = copy.deepcopy(model).float()
        source = f"your {type(inner).__name__} (a copy in fp32)"
        made = trainable_for_the_comparison(runner)
        if made:
            source += f", {made}"
        return runner, source
    twin = tiny_twin(inner)
    if "accepts_loss_kwargs" in vars(inner):
        twin.accepts_loss_kwargs = inner.accepts_loss_kwargs
    text = twin.config.get_text_config() if hasattr(twin.config, "get_text_config") else twin.config
    size = sum(p.numel() for p in twin.parameters())
    # an offloaded model holds meta tensors where its weights are, and accelerate refuses to move it (the Trainer's
    # accelerator.prepare does): its copy cannot train, so the twin runs whatever the model's size
    why = (f"; {offload_sentence(offloaded)}: the Trainer cannot move or copy it, and the accumulation arithmetic "
           "does not depend on the weights" if offloaded and elements <= REAL_MODEL_MAX_ELEMENTS and not quantized
           else "")
    return twin, (f"a tiny twin of your {type(inner).__name__} (the same class from your config shrunk: "
                  f"{getattr(text, 'num_hidden_layers', None) or 'its'} layers, {size:,} parameter elements{why})")


def trainable_for_the_comparison(runner) -> str | None:
    """Make the copy trainable when nothing in it is (an adapter loaded for inference by the plain set-up, a frozen
    model): the Trainer's step ends in a backward, which raises "element 0 of tensors does not require grad"
    otherwise. The loss the Trainer logs, and how it accumulates, do not depend on which parameters train; the
    copy's active adapter is made trainable as `PeftModel.from_pretrained(..., is_trainable=True)` makes it (what
    training that adapter does), else every floating parameter (a full fine-tune). Returns what was done, None when
    the copy already had trainable parameters. Only the copy changes: the user's model is left as it is."""
    if any(p.requires_grad for p in runner.parameters()):
        return None
    if hasattr(runner, "peft_config") and hasattr(getattr(runner, "base_model", None), "set_adapter"):
        try:
            runner.base_model.set_adapter(runner.active_adapters, inference_mode=False)
        except (AttributeError, TypeError, ValueError):
            pass
        if any(p.requires_grad for p in runner.parameters()):
            return ("its adapter made trainable for the comparison as is_trainable=True loads it (nothing in the "
                    "model as prepared is trainable: an adapter loaded for inference)")
    for p in runner.parameters():
        if p.is_floating_point():
            p.requires_grad_(True)
    return ("every parameter made trainable for the comparison (nothing in the model as prepared is trainable; the "
            "loss the Trainer logs does not depend on which parameters train)")


def without_dropout(model) -> int:
    """Dropout off, so that the two runs differ only in how the Trainer accumulates: every dropout module's p, every
    float module attribute and config field named for dropout set to 0. Returns how many were set."""
    from torch.nn.modules.dropout import _DropoutNd

    changed = 0
    for module in model.modules():
        if isinstance(module, _DropoutNd) and module.p:
            module.p, changed = 0.0, changed + 1
        for name, value in list(vars(module).items()):
            if ("dropout" in name.lower() or "pdrop" in name.lower()) and isinstance(value, float) and value:
                setattr(module, name, 0.0)
                changed += 1
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            changed += _config_without_dropout(config)
    return changed


def _config_without_dropout(config) -> int:
    changed = 0
    for name, value in list(vars(config).items()):
        if ("dropout" in name.lower() or "pdrop" in name.lower()) and isinstance(value, float) and value:
            setattr(config, name, 0.0)
            changed += 1
        elif hasattr(value, "to_dict") and not name.startswith("_"):
            changed += _config_without_dropout(value)
    return changed


class _Rows:
    """A map-style dataset of fixed rows (the Trainer samples from it)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


def accumulation_rows(model, head: str, count: int) -> list[dict[str, Any]]:
    """`count` rows of SEQUENCE tokens, no padding; token labels masked (-100) in a different number per row."""
    import torch

    from workbench.model.heads import labels_for

    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(getattr(text, "vocab_size", 256) or 256)
    special = set(config_token_ids(config))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, max(4, min(vocab, 250)), (count, SEQUENCE), generator=generator)
    for token in special:  # no row holds a special token (a pad id would be read as padding)
        ids[ids == token] = 3 if token != 3 else 4
    labels = labels_for(model, {"input_ids": ids})
    if head in ("causal_lm", "image_text_to_text", "seq2seq_lm", "token_cls"):
        labels = labels.clone()
        for row in range(count):
            labels[row, : 2 + 3 * (row % 4)] = -100
    return [{"input_ids": ids[r].tolist(), "attention_mask": [1] * SEQUENCE,
             "labels": labels[r].tolist() if labels.dim() > 1 else labels[r].item()} for r in range(count)]


def _run_arguments(configuration, batch: int, accumulation: int, output_dir: str):
    """The configured arguments with what the measurement needs: one step of `batch` × `accumulation`, lr 0, CPU,
    fp32, no checkpointing, logging every step, nothing saved or reported."""
    args = configuration.args
    overrides = dict(output_dir=output_dir, learning_rate=0.0, per_device_train_batch_size=batch,
                     gradient_accumulation_steps=accumulation, max_steps=1, logging_steps=1, save_strategy="no",
                     eval_strategy="no", report_to="none", use_cpu=True, fp16=False, bf16=False,
                     activation_checkpointing=False, gradient_checkpointing=False, torch_compile=False,
                     dataloader_num_workers=0, deepspeed=None, fsdp="", fsdp_config=None, optim="adamw_torch",
                     lr_scheduler_type="constant", warmup_steps=0, seed=0, remove_unused_columns=False,
                     disable_tqdm=True, use_liger_kernel=False)
    known = {f.name for f in dataclasses.fields(args) if f.init}
    overrides = {k: v for k, v in overrides.items() if k in known}
    with gpu_configuration():
        return dataclasses.replace(args, **overrides)


def _dataset(rows: list[dict[str, Any]]):
    """A datasets.Dataset of the rows (trl's trainers take nothing else), else a plain map-style dataset."""
    try:
        from datasets import Dataset
    except ImportError:
        return _Rows(rows)
    return Dataset.from_list(rows)


def _one_step(trainer_class, model, args, rows, compute_loss_func, processing_class) -> tuple[float, float, bool]:
    from transformers import default_data_collator
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    kwargs = dict(model=model, args=args, train_dataset=_dataset(rows), data_collator=default_data_collator)
    if compute_loss_func is not None:
        kwargs["compute_loss_func"] = compute_loss_func
    if processing_class is not None:
        kwargs["processing_class"] = processing_class
    trainer = trainer_class(**kwargs)
    for callback in (PrinterCallback, ProgressCallback):  # the log goes to log_history, not to the notebook
        trainer.remove_callback(callback)
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    return float(logged["loss"]), float(logged.get("grad_norm", float("nan"))), bool(trainer.model_accepts_loss_kwargs)


def loss_accumulation_probe(prepared, configuration) -> LossAccumulationResult:
    """Run the Trainer twice (module docstring) and compare what it logs."""
    import torch
    import transformers

    from workbench.model.components import unwrap_model
    from workbench.model.heads import head_kind

    model = prepared.model
    inner, _ = unwrap_model(model)
    head = head_kind(model)
    if head not in HEADS_WITH_LABELS:
        raise NotApplicable(f"{type(inner).__name__} is a {head} model: no loss from labels for the Trainer to "
                            "accumulate; this check covers causal LMs (VLMs on text rows), seq2seq LMs, sequence and token "
                            "classification",
                            f"no label loss on {type(inner).__name__}")
    main_input = getattr(inner, "main_input_name", "input_ids")
    if main_input != "input_ids":
        raise NotApplicable(f"{type(inner).__name__} reads {main_input}, not token ids: the accumulation runs feed "
                            "rows of token ids only", f"{type(inner).__name__} takes {main_input}")
    configured = int(getattr(configuration.args, "gradient_accumulation_steps", 1) or 1)
    k = configured if configured > 1 else PROBE_ACCUMULATION
    b = MICRO_BATCH
    trainer = configuration.trainer
    trainer_class, note = transformers.Trainer, None
    if trainer is not None and isinstance(trainer, transformers.Trainer):
        trainer_class = type(trainer)
    compute_loss_func = getattr(trainer, "compute_loss_func", None)
    processing_class = getattr(trainer, "processing_class", None)
    runner, source = _model_for_runs(model)
    if without_dropout(runner):
        source += ", dropout off"
    runner_inner = unwrap_model(runner)[0]
    if getattr(runner_inner, "is_activation_checkpointing", False):  # the loss is the same; reentrant checkpointing
        runner_inner.activation_checkpointing_disable()             # on frozen inputs would leave no gradient
    rows = accumulation_rows(runner_inner, head, b * k)
    results = []
    with tempfile.TemporaryDirectory(prefix="workbench-ga-") as out, torch.random.fork_rng():
        for batch, accumulation in ((b * k, 1), (b, k)):
            args = _run_arguments(configuration, batch, accumulation, out)
            state = copy.deepcopy(runner)  # both runs start from the same weights and optimizer state
            try:
                results.append(_one_step(trainer_class, state, args, rows, compute_loss_func, processing_class))
            except Exception as exc:  # noqa: BLE001 - a trl trainer needs its own dataset format
                if trainer_class is transformers.Trainer:
                    raise
                note = (f"{trainer_class.__name__} did not run on pre-tokenized rows ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); measured with transformers.Trainer, "
                        "whose training_step and num_items_in_batch rule it inherits")
                trainer_class = transformers.Trainer
                results.append(_one_step(trainer_class, state, args, rows, compute_loss_func, processing_class))
    (loss_a, grad_a, _), (loss_b, grad_b, accepts) = results
    forward = type(runner_inner).forward
    takes = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(forward).parameters.values())
    import peft

    return LossAccumulationResult(
        model_class=type(inner).__name__, model_source=source, trainer_class=trainer_class.__name__,
        trainer_note=note, configured_accumulation=configured, accumulation=k, micro_batch=b, loss_a=loss_a,
        loss_b=loss_b, grad_norm_a=grad_a, grad_norm_b=grad_b, accepts_loss_kwargs=accepts,
        forward_takes_kwargs=takes, forward_passes_kwargs_to_loss=_passes_kwargs_to_loss(type(inner)),
        configuration_source=configuration.source, peft_wrapped=inner is not model,
        versions={"transformers": transformers.__version__, "torch": torch.__version__, "peft": peft.__version__})
