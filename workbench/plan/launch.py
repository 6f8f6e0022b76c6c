"""The launch as `accelerate launch --config_file FILE` sets it up, asked of accelerate's own launcher (accelerate
1.15, `accelerate/commands/launch.py` and `accelerate/utils/launch.py`):

    launch = read_accelerate_config("fsdp.yaml")   # processes, distributed type, each process' environment
    with launched(launch.environment):             # TrainingArguments and the FSDP plugin read it, as in the run
        args = TrainingArguments(...)

`accelerate launch` parses the config file into its arguments (`_validate_launch_command`) and starts each process
with an environment (`prepare_multi_gpu_env`): `ACCELERATE_MIXED_PRECISION`, and under FSDP `ACCELERATE_USE_FSDP`
and the `FSDP_*` fields. In the run, `TrainingArguments` takes its mixed precision from that environment unless
`bf16` / `fp16` are set, and the Trainer's Accelerator builds `FullyShardedDataParallelPlugin()` from it when the
training arguments name no FSDP. DeepSpeed is not installed here: a DEEPSPEED config is read for its ZeRO stage and
offload devices (or its `deepspeed_config_file`), which the planner treats as a training-args `deepspeed` field.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from workbench.errors import UsageError

PASSED_ON = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FSDP")  # and every FSDP_* key


@dataclasses.dataclass(frozen=True)
class Launch:
    source: str  # the config file, in words
    distributed_type: str  # NO, MULTI_GPU, FSDP, DEEPSPEED, ...
    processes: int  # num_processes over all machines
    environment: dict[str, str]  # what each process gets that TrainingArguments and accelerate's plugins read
    deepspeed: dict[str, Any] | str | None = None  # a DeepSpeed configuration (dict or JSON file) under DEEPSPEED

    @property
    def fsdp(self) -> bool:
        return self.environment.get("ACCELERATE_USE_FSDP") == "true"


def read_accelerate_config(path: str) -> Launch:
    """The launch an accelerate config file describes (module docstring); a file accelerate cannot read is one line
    (UsageError)."""
    import yaml
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    file = Path(path).expanduser()
    if not file.is_file():
        raise UsageError(f"--accelerate-config {path}: no such file; pass the YAML `accelerate config` wrote "
                         "(~/.cache/huggingface/accelerate/default_config.yaml by default)")
    try:
        args = launch_command_parser().parse_args(["--config_file", str(file), "train.py"])
        args, _, _ = _validate_launch_command(args)
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError, OSError, SystemExit) as exc:
        raise UsageError(f"--accelerate-config {path}: accelerate cannot read it ({str(exc).splitlines()[0][:200]})"
                         ) from None
    kind = _distributed_type(args)
    processes = int(args.num_processes or 1)
    if kind == "DEEPSPEED":
        environment = {"ACCELERATE_MIXED_PRECISION": str(args.mixed_precision or "no").lower()}
        deepspeed: dict[str, Any] | str = args.deepspeed_config_file or {"zero_optimization": {
            "stage": args.zero_stage, "offload_param": {"device": args.offload_param_device or "none"},
            "offload_optimizer": {"device": args.offload_optimizer_device or "none"}}}
        return Launch(str(file), kind, processes, environment, deepspeed)
    try:
        full = prepare_multi_gpu_env(args)
    except ValueError as exc:  # e.g. cpu_ram_efficient_loading without sync_module_states
        raise UsageError(f"--accelerate-config {path}: accelerate refuses it ({str(exc).splitlines()[0][:200]})"
                         ) from None
    environment = {k: v for k, v in full.items() if k in PASSED_ON or k.startswith("FSDP_")}
    return Launch(str(file), kind, processes, environment)


def _distributed_type(args) -> str:
    if args.use_deepspeed:
        return "DEEPSPEED"
    if args.use_fsdp:
        return "FSDP"
    if args.multi_gpu or int(args.num_processes or 1) > 1:
        return "MULTI_GPU"
    return "NO"


@contextlib.contextmanager
def launched(environment: dict[str, str]):
    """This process' environment as the launch gives it, then as it was (`runtime.environment_as_found`: what the
    stack sets on the way too)."""
    from workbench.runtime import environment_as_found

    with environment_as_found(environment):
        yield
