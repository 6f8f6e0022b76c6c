"""train.ddp_checkpointing: the cell of use_reentrant × find_unused_parameters × static_graph the run lands in.

Reentrant activation checkpointing re-runs each checkpointed layer's forward inside the backward; with
`find_unused_parameters=True` (and no `static_graph`) DDP's reducer then sees a parameter ready twice and raises
"Expected to mark a variable ready only once" (2 gloo ranks, tiny Llama + LoRA; notebook 06 with `--distributed 2`
runs that cell for real). Each axis is read as the installed code resolves it:

- **use_reentrant**: the checkpoint function already installed on the model (PEFT's
  `prepare_model_for_kbit_training` passes `{}`, peft 0.21.2 utils/other.py:190-191, so torch's own default
  applies: `use_reentrant=None` means True, torch/utils/checkpoint.py:486-496); when the configuration turns on
  `activation_checkpointing`, the Trainer calls `activation_checkpointing_enable(kwargs or None)` with
  `every_n_layers` / `offload` taken out (transformers 5.23 trainer.py:1505-1525), and transformers' None means
  `{"use_reentrant": False}` (modeling_utils.py:3148-3149): that call is made on a tiny twin of the model's class and
  its checkpoint function read back. trl's own forcing (PEFT + DeepSpeed ZeRO-3 → `use_reentrant=True`,
  trl 1.16 sft_trainer.py:875-895) is already in `trainer.args` when the set-up returned the trl trainer.
- **find_unused_parameters / static_graph**: from the Trainer the set-up returned (its accelerator's DDP
  kwargs), else `Trainer._build_accelerator_args` asked on a stand-in holding the configured arguments and the
  prepared model (explicit `ddp_find_unused_parameters`, else False for a `PreTrainedModel` that checkpoints and
  True for anything that is not one — a `PeftModel` is not).

In the training callback the run's launch is known (`configuration.launch`): in one process DDP wraps nothing, and
the raising cell is `info`; on ≥ 2 processes it fails. A diagnosis does not know the launch: the raising cell is a
`warn` naming that condition (one check, one answer: a verdict on a choice the user did not state is a warn).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

from workbench.display.nodes import Code, Display, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding

CHECK = "train.ddp_checkpointing"
READY_TWICE = "Expected to mark a variable ready only once"
TORCH_DEFAULT_REENTRANT = True  # torch/utils/checkpoint.py:486-496 (torch 2.13): use_reentrant=None -> True


@dataclasses.dataclass(frozen=True)
class CheckpointingAxis:
    enabled: bool
    use_reentrant: bool | None  # None when checkpointing is off
    how: str  # where the value comes from, in words


@dataclasses.dataclass(repr=False)
class DdpCheckpointingResult(ProbeResult):
    model_class: str
    checkpointing: CheckpointingAxis
    find_unused_parameters: bool
    find_unused_how: str
    static_graph: bool
    static_graph_how: str
    configuration_source: str
    versions: dict[str, str]
    launch: Any = None  # configuration.launch: the running training's (the training callback), else None

    @property
    def raises(self) -> bool:
        c = self.checkpointing
        return bool(c.enabled and c.use_reentrant and self.find_unused_parameters and not self.static_graph)

    def _evidence(self) -> dict[str, Any]:
        return {"model_class": self.model_class, "checkpointing": self.checkpointing.enabled,
                "use_reentrant": self.checkpointing.use_reentrant, "use_reentrant_from": self.checkpointing.how,
                "find_unused_parameters": self.find_unused_parameters, "find_unused_from": self.find_unused_how,
                "static_graph": self.static_graph, "static_graph_from": self.static_graph_how,
                "configuration": self.configuration_source, **self.versions,
                **({"launch": self.launch.describe()} if self.launch is not None else {})}

    def _cell(self) -> str:
        c = self.checkpointing
        reentrant = "no checkpointing" if not c.enabled else f"use_reentrant={c.use_reentrant}"
        return (f"{reentrant} ({c.how}); find_unused_parameters={self.find_unused_parameters} "
                f"({self.find_unused_how}); static_graph={self.static_graph} ({self.static_graph_how})")

    def findings(self) -> list[Finding]:
        cell = self._cell()
        assumed = (" Configuration: the Trainer's defaults (none given)." if self.configuration_source == "defaults"
                   else f" Configuration: {self.configuration_source}.")
        if self.raises:
            fix = ("in order of safety: (1) non-reentrant checkpointing — "
                   "`TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={'use_reentrant': "
                   "False})`, or `prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs="
                   "{'use_reentrant': False})`; (2) `ddp_static_graph=True` (the graph is the same every step); "
                   "(3) `ddp_find_unused_parameters=False`, only when every trainable parameter gets a gradient every "
                   "step (grad.flow says so) — else DDP raises 'Expected to have finished reduction'")
            if self.launch is not None and self.launch.processes == 1:  # DDP wraps nothing in one process
                return [Finding(CHECK, "info", "One process: DDP does not wrap this run; under DDP it would raise "
                                f"'{READY_TWICE}'",
                                f"{cell}. This run trains in {self.launch.describe()}: no DDP reducer, nothing "
                                f"raises. Launched with torchrun on ≥ 2 processes, torch would raise \"{READY_TWICE}\" "
                                "at the first backward." + assumed, self._evidence(), fix)]
            why = (f"{cell}: reentrant checkpointing re-runs each layer's forward in the backward and DDP, looking "
                   "for unused parameters without a static graph, marks a parameter ready twice: torch raises "
                   f"\"{READY_TWICE}\" at the first backward under DDP (≥ 2 processes).")
            if self.launch is None:  # a diagnosis: how many processes the run launches is not stated
                return [Finding(CHECK, "warn", f"Under DDP (≥ 2 processes) this run would raise '{READY_TWICE}'",
                                f"{why} The number of processes the run is launched with is not known here: in one "
                                "process nothing raises; with torchrun or accelerate launch on ≥ 2 it does."
                                + assumed, self._evidence(), fix)]
            return [Finding(CHECK, "fail", "DDP will raise 'Expected to mark a variable ready only once'",
                            f"{why} This run trains in {self.launch.describe()}." + assumed, self._evidence(), fix)]
        why = ("no activation checkpointing" if not self.checkpointing.enabled
               else "non-reentrant checkpointing" if not self.checkpointing.use_reentrant
               else "static_graph=True" if self.static_graph else "find_unused_parameters=False")
        return [Finding(CHECK, "pass", f"DDP with checkpointing: a safe cell ({why})", cell + "." + assumed,
                        self._evidence())]

    def details(self):
        c = self.checkpointing
        rows = [["use_reentrant", Code(repr(c.use_reentrant) if c.enabled else "checkpointing off"), c.how],
                ["find_unused_parameters", Code(repr(self.find_unused_parameters)), self.find_unused_how],
                ["static_graph", Code(repr(self.static_graph)), self.static_graph_how]]
        return Display(Table(["axis", "value", "from"], rows, left=True),
                       Paragraph("Raises under DDP only for use_reentrant=True, find_unused_parameters=True, "
                                 "static_graph=False."))


def installed_checkpoint_function(model) -> Any | None:
    """The checkpoint function transformers installed on the model's checkpointing layers, or None when off."""
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            return getattr(module, "_gradient_checkpointing_func", None)
    return None


def reentrant_of(function: Any) -> tuple[bool, str]:
    """use_reentrant of an installed checkpoint function (a functools.partial of torch's checkpoint)."""
    keywords = function.keywords if isinstance(function, functools.partial) else {}
    if "use_reentrant" in keywords and keywords["use_reentrant"] is not None:
        return bool(keywords["use_reentrant"]), f"use_reentrant={keywords['use_reentrant']} passed to checkpoint"
    return TORCH_DEFAULT_REENTRANT, (f"checkpoint called with {dict(keywords) or '{}'}: torch's default "
                                     "use_reentrant=None means True")


def trainer_checkpointing(model, args) -> CheckpointingAxis | None:
    """What the Trainer's own activation_checkpointing call installs, asked of a tiny twin of the model's class;
    None when the configuration does not turn checkpointing on."""
    if not getattr(args, "activation_checkpointing", getattr(args, "gradient_checkpointing", False)):
        return None
    from workbench.model.components import unwrap_model
    from workbench.probes.train.loss_accumulation import tiny_twin

    kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None)
                  or getattr(args, "gradient_checkpointing_kwargs", None) or {})
    kwargs.pop("every_n_layers", None)
    kwargs.pop("offload", None)
    inner, _ = unwrap_model(model)
    twin = tiny_twin(inner)
    enable = getattr(twin, "activation_checkpointing_enable", None) or twin.gradient_checkpointing_enable
    try:
        enable(kwargs or None)
    except ValueError as exc:  # the class does not support checkpointing: the Trainer raises the same
        return CheckpointingAxis(False, None, f"the Trainer's call raises for {type(inner).__name__}: {exc}")
    function = installed_checkpoint_function(twin)
    if function is None:
        return CheckpointingAxis(False, None, f"{type(inner).__name__} installs no checkpoint function")
    reentrant, how = reentrant_of(function)
    given = f"activation_checkpointing_kwargs={kwargs or None}"
    return CheckpointingAxis(True, reentrant, f"the Trainer enables it with {given}: {how}")


def ddp_kwargs(configuration, model) -> tuple[dict[str, Any], str]:
    """find_unused_parameters and static_graph as the Trainer hands them to accelerate's DDP."""
    trainer = configuration.trainer
    handler = getattr(getattr(trainer, "accelerator", None), "ddp_handler", None)
    if handler is not None:
        return ({"find_unused_parameters": handler.find_unused_parameters, "static_graph": handler.static_graph},
                f"your {type(trainer).__name__}'s accelerator")
    from transformers import Trainer

    built = Trainer._build_accelerator_args(types.SimpleNamespace(args=configuration.args, model=model))
    handler = next(h for h in built["kwargs_handlers"] if hasattr(h, "find_unused_parameters"))
    return ({"find_unused_parameters": handler.find_unused_parameters, "static_graph": handler.static_graph},
            f"Trainer._build_accelerator_args on your {type(model).__name__}")


def ddp_checkpointing_probe(prepared, configuration) -> DdpCheckpointingResult:
    """The matrix cell (module docstring)."""
    import peft
    import torch
    import transformers

    from workbench.model.components import unwrap_model

    model = prepared.model
    inner, _ = unwrap_model(model)
    args = configuration.args
    axis = trainer_checkpointing(model, args)
    if axis is None:
        function = installed_checkpoint_function(model)
        if function is None:
            axis = CheckpointingAxis(False, None, "off in your set-up and in the configuration")
        else:
            reentrant, how = reentrant_of(function)
            axis = CheckpointingAxis(True, reentrant, f"enabled by your set-up: {how}")
    kwargs, where = ddp_kwargs(configuration, model)
    explicit = getattr(args, "ddp_find_unused_parameters", None)
    if explicit is not None:
        find_how = f"ddp_find_unused_parameters={explicit} ({where})"
    elif isinstance(model, transformers.PreTrainedModel):
        find_how = (f"the Trainer's rule for a PreTrainedModel: not checkpointing ({where})")
    else:
        find_how = f"the Trainer's rule: {type(model).__name__} is not a PreTrainedModel, so True ({where})"
    static = kwargs.get("static_graph")
    static_how = (f"ddp_static_graph={args.ddp_static_graph}" if getattr(args, "ddp_static_graph", None) is not None
                  else "ddp_static_graph unset: DDP's default False")
    return DdpCheckpointingResult(
        model_class=type(inner).__name__, checkpointing=axis,
        find_unused_parameters=bool(kwargs.get("find_unused_parameters")), find_unused_how=find_how,
        static_graph=bool(static), static_graph_how=static_how, configuration_source=configuration.source,
        versions={"transformers": transformers.__version__, "torch": torch.__version__, "peft": peft.__version__},
        launch=getattr(configuration, "launch", None))
