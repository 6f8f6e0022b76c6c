"""What this host's malloc keeps resident over a CPU training step, measured rather than modelled: a real
`transformers.Trainer` runs the set-up's steps (`real_step`, in a process of its own) on the model built from its config
with random weights — no weight is read — and the resident rise above the loaded weights is the step's.

    heap = measured_heap(setup, planned_peak_bytes)   # HostHeap: rise_bytes, or None and the reason

Fake tensors count the live tensors; a CPU process holds more. glibc's dynamic mmap threshold sends later
activations to the heap, where freed holes beside small live chunks stay resident: 10–78 % more than the live
tensors on the bench's four set-ups (docs/plan.md). That retention depends on every small allocation the process
makes, so neither the replay of the tensors' trace (`cpu_allocator`: under a tenth of it) nor copies of the model cut
to 2 and 4 layers and extended to its depth predict it: measured on the bench's 90M Qwen2 (8 layers), the copies'
own run-to-run spread, multiplied by the extension, put the extended figure of its LoRA 8 × 512 14 % under to 9 %
over the whole model's run, whose own runs agreed within 5 %. So the whole depth is run, once: a CPU plan costs one
real step more, and says what it measured.

The step runs in a fresh process, or where a kernel server runs (a sweep, `diagnose --jobs`, the test suite) in one
forked from it (`real_step_command`): the stack is imported there already (about 6 s of a fresh process's 7 s on 2
cores), and the server, which only imported, hands its child a malloc that retains as a fresh process's does.
Measured side by side, four runs each, on this project's 2-core host: 713–738 MiB fresh against 732 MiB forked (4
layers, hidden 256, batch 8 × 256), 291–322 against 298–313 MiB (the tests' LoRA set-up, batch 8 × 256, two hours),
13 against 18 MiB (2 layers, hidden 64, batch 2 × 32: 2.8 MiB of anonymous rise in both, 11.7 against 17.1 MiB of
file pages); on the bench's 90M Qwen2 with LoRA r16, batch 4 × 256, 1,001 MiB forked against 1,004–1,044 MiB
fresh, 3.9 s against 10.2 s (`make bench --only-plan-fork`, bench/RESULTS.md). The forked child's few MiB more are
code pages: fork copies no page table entry of a read-only file mapping, so the library pages the server had
touched count again when the step touches them. A `MALLOC_*` variable the server was not started with (glibc reads
them as a process starts) makes it refuse, and the step starts fresh.

Not measured (the reason says why, and the replay stands): a QLoRA set-up (bitsandbytes quantizes weights as it
loads them, and the model built here loads none), several processes, a model that is not a causal LM (`real_step`
trains token labels), a step that would not fit this host's available memory, or a real step that fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REAL_STEP_TIMEOUT_S = 1800
# fields `real_step` sets itself (a run that saves and logs nothing, on the CPU)
SET_BY_REAL_STEP = ("output_dir", "max_steps", "report_to", "save_strategy", "logging_strategy", "use_cpu",
                    "dataloader_num_workers", "disable_tqdm")


@dataclasses.dataclass
class HostHeap:
    rise_bytes: int | None  # the real step's resident rise above its loaded weights
    malloc: str  # the C library whose policy was measured, and any MALLOC_* setting in force
    seconds: float
    reason: str | None = None  # why it was not measured
    ran: dict | None = None  # what the real step ran, as it reports it (batch, seq, checkpointing, optimizer, …)

    def describe(self) -> str:
        return (f"measured on this host ({self.malloc}): a real Trainer step of the model with random weights rose "
                f"{self.rise_bytes / 2**20:,.0f} MiB above its weights; a CPU with another malloc or other MALLOC_* "
                "settings keeps another amount")


def _malloc() -> str:
    name, version = platform.libc_ver()
    tuned = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_"))
    return " ".join([f"{name or 'libc'} {version}".strip(), *tuned])


def _not_measured(reason: str) -> HostHeap:
    return HostHeap(None, _malloc(), 0.0, reason)


def model_config(config, dtype):
    """The config as the plan builds the model: in the plan's load dtype (`--dtype`)."""
    import copy

    config = copy.deepcopy(config)
    config.dtype = str(dtype).removeprefix("torch.")
    return config


def training_fields(setup) -> dict:
    """The user's TrainingArguments fields as `real_step` takes them: the plan's batch, and only fields
    TrainingArguments itself has (an SFTConfig's data fields shape the batch, which the set-up already says)."""
    from transformers import TrainingArguments

    from workbench.probes.train.configuration import read_training_args_file

    fields: dict = {}
    if Path(str(setup.args_source)).expanduser().is_file():
        _, fields = read_training_args_file(setup.args_source)
    known = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    fields = {k: v for k, v in fields.items() if k in known and k not in SET_BY_REAL_STEP and k != "deepspeed"}
    fields["per_device_train_batch_size"] = setup.batch
    if setup.precision in ("bf16", "fp16"):  # also where only an accelerate config's mixed_precision says it
        fields[setup.precision] = True
    return fields


def _adapter_file(setup, folder: Path) -> list[str]:
    if setup.peft is None:
        return []
    fields = {k: v for k, v in setup.peft.items() if k not in ("base_model_name_or_path", "revision")}
    fields["inference_mode"] = False  # a saved adapter says True; training needs its weights trainable
    path = folder / "adapter_config.json"
    path.write_text(json.dumps(fields))
    return [str(path)]


def real_step_command(config_dir: Path, fields: dict, adapter: list[str], seq: int, packed: bool = False,
                      scratch: Path | None = None) -> list[str]:
    """`python -m workbench.plan.real_step …`; where a kernel server runs (`workbench.report.kernel_server`: a
    sweep, `diagnose --jobs`, the test suite) the step's process is forked from it, the stack already imported
    (module docstring)."""
    from workbench.report.kernel_client import served_module

    args = [str(config_dir), json.dumps(fields), *adapter, "--seq", str(seq), *(["--packed"] if packed else []),
            *(["--scratch", str(scratch)] if scratch is not None else [])]
    return [sys.executable, "-m", *served_module("workbench.plan.real_step", args)]


def _real_step(config_dir: Path, setup, adapter: list[str]) -> dict:
    argv = real_step_command(config_dir, training_fields(setup), adapter, setup.seq, setup.packed,
                             scratch=config_dir.parent)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=REAL_STEP_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        last = next((x for x in reversed(proc.stderr.splitlines()) if x.strip()), f"exit {proc.returncode}")
        raise RuntimeError(last.strip()[:300])
    return json.loads(line)


def measured_heap(setup, planned_peak_bytes: int) -> HostHeap:
    """The set-up's resident rise above its weights on this host (module docstring), or why it was not measured.
    `planned_peak_bytes`: the fake step's peak; the real one may hold up to twice it (the bench's largest retention
    is +74 %), which must fit this host's available memory before anything runs."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from workbench.model.memory import host_available_bytes

    if setup.setup == "qlora":
        return _not_measured("a QLoRA set-up: bitsandbytes quantizes weights as it loads them, and the model built "
                             "here loads none")
    if setup.gpus > 1:
        return _not_measured(f"{setup.gpus} processes: the real step runs one")
    names = list(getattr(setup.config, "architectures", None) or [])
    if names and not set(names) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return _not_measured(f"{names[0]} is not a causal LM, and the real step trains token labels")
    available, _ = host_available_bytes()
    if 2 * planned_peak_bytes > available:
        return _not_measured(f"the step plans {planned_peak_bytes / 2**30:.1f} GiB, and a real one may hold twice "
                             f"that: more than this host's {available / 2**30:.1f} GiB available")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="workbench-heap-") as scratch:
        folder = Path(scratch)
        config_dir = folder / "model"
        model_config(setup.config, setup.dtype).save_pretrained(config_dir)
        try:
            real = _real_step(config_dir, setup, _adapter_file(setup, folder))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return _not_measured(f"the real step failed: {exc}")
    return HostHeap(int(real["above_weights_bytes"]), _malloc(), time.monotonic() - start, ran=real.get("ran"))
