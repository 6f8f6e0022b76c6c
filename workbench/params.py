"""Parameter files (YAML): options that are not worth a command-line flag. Unknown keys are errors.

    components:                 # regexes over tensor names, checked before the structural split
      vision: ['^model\\.visual\\.']
    real_quant_max_bytes: 134217728    # verify predicted 4/8-bit censuses by a real load below this size
    compare: [path/to/base]     # other checkpoints for the comparison table (headers + predictions only)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from workbench.errors import UsageError

SCHEMA: dict[str, type] = {"components": dict, "real_quant_max_bytes": int, "compare": list,
                           # the training run notebook 02 simulates (the demo's write-up: 272 samples, 2 per GPU -> 136 steps)
                           "dataset_size": int, "per_device_train_batch_size": int,
                           "gradient_accumulation_steps": int,
                           # a safetensors file of forward inputs, for models whose inputs cannot be built
                           "forward_inputs": str,
                           # refuse to load above this many bytes instead of the machine's available memory
                           "memory_limit_bytes": int,
                           # notebook 05: a recipes file ("demo": the bundled demo's), an evaluation dataset
                           # folder (data.jsonl + images) and how many of its rows to use
                           "recipes": str, "eval_dataset": str, "eval_samples": int,
                           # notebook 06: TrainingArguments.ddp_find_unused_parameters as your run sets it
                           # (absent: the Trainer's own choice)
                           "ddp_find_unused_parameters": bool,
                           # notebook 07 (--data): rows to read (absent: every row), the run's max_length (absent:
                           # your Trainer's, else trl's SFTConfig default) and its loss masking when no Trainer says
                           "data_samples": int, "max_length": int, "completion_only_loss": bool,
                           "assistant_only_loss": bool,
                           # notebook 10: the engines the adapter is served on (absent: every engine the rules know)
                           "serve_engines": list,
                           # notebook 11 (--training-args): the GPU the plan is judged against, by name or size
                           "plan_gpu": str, "plan_memory": str}


def validate_params(data: Any, source: str = "parameters") -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of options at the top level, got {type(data).__name__}")
    for key, value in data.items():
        if key not in SCHEMA:
            raise UsageError(f"{source}: unknown key {key!r}; known keys: {', '.join(sorted(SCHEMA))}")
        if not isinstance(value, SCHEMA[key]) or (isinstance(value, bool) and SCHEMA[key] is not bool):
            raise UsageError(f"{source}: {key} must be a {SCHEMA[key].__name__}, got {type(value).__name__}")
    for component, patterns in (data.get("components") or {}).items():
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise UsageError(f"{source}: components.{component} must be a list of regex strings")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsageError(f"{source}: components.{component}: bad regex {pattern!r} ({exc})") from None
    return dict(data)


def load_params(path: str | Path | None) -> dict[str, Any]:
    if not path:
        return {}
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"parameters file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"parameters file {path} is not valid YAML ({str(exc).splitlines()[0]})") from None
    params = validate_params(data, str(path))
    if "compare" in params:  # relative to where the user runs from, not to the kernel's report folder
        params["compare"] = [str(Path(p).resolve()) for p in params["compare"]]
    if "forward_inputs" in params:
        params["forward_inputs"] = str(Path(params["forward_inputs"]).resolve())
    return params
