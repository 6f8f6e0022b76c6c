"""What is planned: the model (config.json of a checkpoint, an adapter folder's base, a hub id's config), the set-up
(plain: as loaded; qlora: the 4-bit base, prepare_model_for_kbit_training), the adapter (`--peft`: an
adapter_config.json or an adapter folder; a qlora set-up without one gets the workbench's fresh LoRA), the training
arguments as the user writes them (TrainingArguments / SFTConfig fields), the batch and sequence length.

    setup = plan_setup(ckpt, training_args="args.yaml", peft=None, setup="plain", seq=None, batch=None)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from workbench.errors import UsageError
from workbench.plan.launch import read_accelerate_config

SETUPS = ("plain", "qlora")
DEFAULT_SEQ = 1024  # when neither --seq nor the training arguments' max_length / max_seq_length say; at most the
#                     model's position limit
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_target_positions")


class NotPlannable(UsageError):
    """The model is not one the planner can step: its training batch is no `input_ids` + `labels`, or its class
    computes no loss from labels. One line, exit 2, from `workbench plan`; a `skip` in notebook 11."""


def position_limit(config) -> int | None:
    """The longest sequence the model's positions allow (a VLM's text config's; the shorter of an encoder-decoder's
    two); None for relative positions."""
    limits = []
    for source in (config, *(getattr(config, k, None) for k in ("text_config", "encoder", "decoder"))):
        value = next((getattr(source, name) for name in POSITION_LIMITS
                      if isinstance(getattr(source, name, None), int) and getattr(source, name) > 0), None)
        if value is not None:
            if source is config:
                return value
            limits.append(value)
    return min(limits) if limits else None


def plannable_class(config):
    """The class the planner builds (config.json's `architectures`, else the causal LM class), refused with
    NotPlannable when its batch is not text ids with labels."""
    import inspect

    import transformers

    names = list(getattr(config, "architectures", None) or [])
    model_class = next((getattr(transformers, n) for n in names if hasattr(transformers, n)), None)
    if model_class is None:
        return None
    if getattr(model_class, "main_input_name", "input_ids") != "input_ids":
        raise NotPlannable(f"{model_class.__name__} trains on `{model_class.main_input_name}`, not token ids: the "
                           "planner builds text batches (input_ids, labels)")
    if "labels" not in inspect.signature(model_class.forward).parameters:
        raise NotPlannable(f"{model_class.__name__} computes no loss from labels (a bare encoder or backbone): "
                           "there is no training step to plan")
    return model_class


@dataclasses.dataclass
class PlanSetup:
    checkpoint: str
    model_dir: Path
    config: Any  # transformers PretrainedConfig
    setup: str
    peft: dict[str, Any] | None  # the adapter config's fields (PEFT's own keys)
    peft_source: str | None
    args: Any  # TrainingArguments (or SFTConfig) built from the user's fields
    args_source: str
    batch: int
    seq: int
    seq_source: str
    device: str
    dtype: Any  # the load dtype (torch.dtype)
    packed: bool = False  # batches without padding (packing, or every row at max_length): no attention mask
    gpus: int = 1  # ranks of the launch (--gpus)
    fsdp: dict[str, Any] | None = None  # FSDP plugin arguments, as the Trainer hands them to accelerate
    fsdp_source: str | None = None  # where they came from, in words
    launch_environment: dict[str, str] = dataclasses.field(default_factory=dict)  # what `accelerate launch` sets
    launch_source: str | None = None  # the accelerate config file it came from

    def replace(self, **changes: Any) -> PlanSetup:
        return dataclasses.replace(self, **changes)

    @property
    def sharded(self) -> bool:
        """FSDP over more than one rank: the step is planned per rank under fully_shard (`fsdp_step`)."""
        return self.fsdp is not None and self.gpus > 1

    @property
    def precision(self) -> str:
        """fp16, bf16 or no, as TrainingArguments decides it (transformers 5.23 training_args.py, "Mixed
        Precision"): its fp16 / bf16 fields, else the launch's ACCELERATE_MIXED_PRECISION."""
        if self.args.fp16:
            return "fp16"
        if self.args.bf16:
            return "bf16"
        return self.launch_environment.get("ACCELERATE_MIXED_PRECISION", "no")

    @property
    def gradient_checkpointing(self) -> bool:
        return bool(self.args.gradient_checkpointing)

    def as_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "model_type": self.config.model_type, "setup": self.setup,
                "peft": self.peft_source, "training_args": self.args_source, "batch": self.batch, "seq": self.seq,
                "seq_source": self.seq_source, "gradient_checkpointing": self.gradient_checkpointing,
                "optimizer": getattr(self.args.optim, "value", str(self.args.optim)), "bf16": self.precision == "bf16", "fp16": self.precision == "fp16",
                "gradient_accumulation_steps": self.args.gradient_accumulation_steps, "device": self.device,
                "dtype": str(self.dtype).removeprefix("torch."), "packed": self.packed, "gpus": self.gpus,
                "fsdp": self.fsdp if self.sharded else None, "fsdp_source": self.fsdp_source,
                "accelerate_config": self.launch_source}


def read_peft(path: str) -> dict[str, Any]:
    """An adapter_config.json, or the one in an adapter folder: its fields."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "adapter_config.json"
    if not p.is_file():
        raise UsageError(f"--peft {path}: no adapter_config.json there; pass the adapter folder or its "
                         "adapter_config.json")
    try:
        data = json.loads(p.read_text())
    except ValueError as exc:
        raise UsageError(f"--peft {p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("peft_type", "LORA") != "LORA":
        raise UsageError(f"--peft {p}: a LoRA adapter_config.json is expected (peft_type LORA)")
    return data


def _arguments(training_args: str | None, overrides: dict[str, Any]):
    """(the TrainingArguments, where they came from, the `deepspeed` field taken out: DeepSpeed is not installed
    here, and TrainingArguments refuses the field without it)."""
    from workbench.probes.train.configuration import build_arguments, read_training_args_file

    if training_args:
        cls, fields = read_training_args_file(training_args)
        source = training_args
    else:
        from transformers import TrainingArguments

        cls, fields, source = TrainingArguments, {}, "the TrainingArguments defaults"
    fields = {**fields, **{k: v for k, v in overrides.items() if v is not None}}
    deepspeed = fields.pop("deepspeed", None)
    return build_arguments(cls, fields, "--training-args"), source, deepspeed


def _sharding(args, deepspeed, launch) -> tuple[dict[str, Any] | None, str | None]:
    """The FSDP plugin arguments the run would use and where they come from: the Trainer's own `fsdp_plugin_args`
    (from `fsdp` / `fsdp_config`), or a DeepSpeed ZeRO-3 configuration planned as FSDP's full sharding (the same
    sharding of parameters, gradients and optimizer states; DeepSpeed is not installed here, so its own buffers are
    not modelled). A set-up the planner cannot shard on fake tensors is one line (UsageError)."""
    from workbench.plan.fsdp import transformers_default_plugin_args

    where = "the training arguments' deepspeed"
    if deepspeed is None and launch is not None and launch.deepspeed is not None:  # the Trainer's own field wins
        deepspeed, where = launch.deepspeed, f"the accelerate config {launch.source} (distributed_type DEEPSPEED)"
    if deepspeed is not None:
        stage, offload = _zero_stage(deepspeed)
        if stage != 3:
            raise UsageError(f"deepspeed ZeRO stage {stage}: not planned (DeepSpeed is not installed here; ZeRO-3 is "
                             "planned as FSDP's full sharding, stages 1 and 2 have no FSDP equivalent)")
        if offload:
            raise UsageError(f"deepspeed ZeRO-3 with {offload}: offloading is not planned (the plan's fake tensors "
                             "cannot tell host memory from the GPU's)")
        return transformers_default_plugin_args(), (f"{where}: ZeRO-3, planned as FSDP2 full sharding (fully_shard: the same "
                                           "sharding of parameters, gradients and optimizer states; DeepSpeed itself "
                                           "is not installed here and its buffers are not modelled)")
    plugin_args = getattr(args, "fsdp_plugin_args", None) if getattr(args, "fsdp", None) else None
    if not plugin_args and launch is not None and launch.fsdp:  # the Trainer's Accelerator reads the launch's FSDP_*
        if launch.environment.get("FSDP_OFFLOAD_PARAMS") == "true":
            raise UsageError(f"{launch.source}: fsdp_offload_params: offloading is not planned (the plan's fake "
                             "tensors cannot tell host memory from the GPU's)")
        return {}, f"the accelerate config {launch.source} (distributed_type FSDP)"
    if not plugin_args:
        return None, None
    if plugin_args.get("cpu_offload"):
        raise UsageError("fsdp_config cpu_offload: offloading is not planned (the plan's fake tensors cannot tell "
                         "host memory from the GPU's)")
    return dict(plugin_args), "the training arguments' fsdp / fsdp_config"


def _zero_stage(deepspeed) -> tuple[int | None, str | None]:
    """(ZeRO stage, the offload it asks for or None) of a DeepSpeed configuration: a dict or a JSON file."""
    if not isinstance(deepspeed, dict):
        path = Path(str(deepspeed)).expanduser()
        try:
            deepspeed = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"deepspeed {path}: not a readable DeepSpeed JSON configuration ({exc})") from None
    zero = deepspeed.get("zero_optimization") or {}
    offload = next((k for k in ("offload_param", "offload_optimizer")
                    if str((zero.get(k) or {}).get("device", "none")).lower() not in ("none", "")), None)
    stage = zero.get("stage")
    return (int(stage) if isinstance(stage, (int, str)) and str(stage).isdigit() else None), offload


def plan_setup(checkpoint: str, *, training_args: str | None = None, peft: str | None = None, setup: str = "plain",
               seq: int | None = None, batch: int | None = None, device: str = "cuda", dtype: str = "auto",
               base: str | None = None, packed: bool | None = None, gpus: int | None = None,
               accelerate_config: str | None = None) -> PlanSetup:
    """Resolve the checkpoint's config (headers only: no weight is read) and the training set-up; UsageError on bad
    input."""
    import torch

    from workbench.model.target import config_folder

    if setup not in SETUPS:
        raise UsageError(f"--setup {setup}: the planner knows {', '.join(SETUPS)}")
    if seq is not None and seq < 1 or batch is not None and batch < 1 or gpus is not None and gpus < 1:
        raise UsageError("--seq, --batch and --gpus: use 1 or more")
    launch = read_accelerate_config(accelerate_config) if accelerate_config else None
    gpus = gpus or (launch.processes if launch else 1)  # --gpus wins, as --num_processes does over the file
    model_dir = config_folder(checkpoint, base)  # a config.json alone is enough: no weight is read
    folder = Path(checkpoint).expanduser()
    adapter_dir = folder if (folder / "adapter_config.json").is_file() else None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise UsageError(f"{checkpoint}: its config.json cannot be read by transformers "
                         f"({str(exc).splitlines()[0][:200]})") from None
    peft_fields, peft_source = None, None
    if peft:
        peft_fields, peft_source = read_peft(peft), peft
    elif adapter_dir is not None:
        peft_fields, peft_source = read_peft(str(adapter_dir)), str(adapter_dir)
    args, args_source, deepspeed = _arguments(training_args, {"per_device_train_batch_size": batch})
    fsdp, fsdp_source = _sharding(args, deepspeed, launch)
    plannable_class(config)
    limit = position_limit(config)
    if seq is None:
        seq = next((getattr(args, k) for k in ("max_length", "max_seq_length") if getattr(args, k, None)), None)
        seq_source = "the training arguments" if seq else f"the default ({DEFAULT_SEQ}; pass --seq)"
        if not seq and limit and limit < DEFAULT_SEQ:
            seq, seq_source = limit, f"the model's position limit ({limit}; pass --seq)"
        seq = seq or DEFAULT_SEQ
    else:
        seq_source = "--seq"
    if limit and seq > limit:
        raise UsageError(f"a sequence of {seq} ({seq_source}) exceeds the model's position limit {limit} "
                         f"({type(config).__name__}): use a max_length of at most {limit}")
    if dtype == "auto":
        load = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
        load_dtype = getattr(torch, load) if isinstance(load, str) else load
    else:
        names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        if dtype not in names:
            raise UsageError(f"--dtype {dtype}: one of auto, {', '.join(names)}")
        load_dtype = names[dtype]
    if packed is None:  # trl's SFTConfig(packing=True) packs rows without padding
        packed = bool(getattr(args, "packing", False))
    return PlanSetup(checkpoint, Path(model_dir), config, setup, peft_fields, peft_source, args, args_source,
                     int(args.per_device_train_batch_size), int(seq), seq_source, device, load_dtype, packed, gpus,
                     fsdp, fsdp_source, launch.environment if launch else {}, launch.source if launch else None)
