"""What is being diagnosed: a checkpoint folder, or an adapter and the base it was trained on.

A CKPT holding adapter_config.json is an adapter; its base is `base_model_name_or_path` there unless --base
overrides it. Hub ids (`org/name`) resolve through `workbench.model.hub`: the local Hugging Face cache only (`hub=
"cache"`, the default: notebook kernels run offline), or fetched by the CLI (`"headers"`: configs, tokenizer and
adapter files, the base's safetensors headers by range requests; `"download"`: everything).

A Trainer's output_dir (trainer_state.json at its root or in `checkpoint-N/`) is a run: the final save at its root is
diagnosed when there is one, else the latest checkpoint (`--checkpoint N` picks another); a `checkpoint-N` folder
given directly is that checkpoint of the run around it. `training_args.bin` (a pickle) is never read here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from workbench.display.result import Displayable
from workbench.errors import UsageError
from workbench.model.hub import HUB_ID, is_hub_id, resolve_hub

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # transformers' PREFIX_CHECKPOINT_DIR + "-" + step
QUANTS = ("none", "4bit", "8bit")
MAX_GPUS_PER_PROCESS = 64


@dataclasses.dataclass(frozen=True)
class TrainerOutput:
    """A Trainer's output_dir and the folder of it being diagnosed."""

    run_dir: Path  # the output_dir
    folder: Path  # the folder diagnosed: the root (its final save) or one checkpoint-N
    checkpoints: tuple[int, ...]  # the steps of its checkpoint-N folders, ascending
    final_save: bool  # the root holds a model or an adapter

    @property
    def step(self) -> int | None:
        """The checkpoint's step; None for the final save at the root."""
        match = CHECKPOINT_FOLDER.match(self.folder.name) if self.folder != self.run_dir else None
        return int(match.group(1)) if match else None

    def describe(self) -> str:
        """Which folder of the run is diagnosed, and why that one (the report's header says it)."""
        saved = f"{len(self.checkpoints)} checkpoint(s)" + (f", the latest checkpoint-{self.checkpoints[-1]}"
                                                              if self.checkpoints else "")
        if self.step is None:
            return f"the final save at the root of {self.run_dir} ({saved})"
        latest = self.checkpoints and self.step == self.checkpoints[-1]
        why = ("the latest checkpoint; no final save at the root" if latest and not self.final_save
               else "the latest checkpoint" if latest else f"one of {saved}")
        return f"checkpoint-{self.step} of {self.run_dir} ({why}" + (
            "; the root holds a final save" if self.final_save else "") + ")"


def _holds_model(folder: Path) -> bool:
    return (folder / "config.json").exists() or (folder / "adapter_config.json").exists()


def _checkpoint_steps(run_dir: Path) -> tuple[int, ...]:
    steps = []
    for child in run_dir.iterdir() if run_dir.is_dir() else ():
        match = CHECKPOINT_FOLDER.match(child.name)
        if match and child.is_dir():
            steps.append(int(match.group(1)))
    return tuple(sorted(steps))


def find_trainer_output(folder: Path, checkpoint: int | None = None) -> TrainerOutput | None:
    """The run `folder` is, or sits in (a checkpoint-N folder), with the folder to diagnose; None when `folder` is
    no Trainer output. `checkpoint`: the step of the checkpoint-N to diagnose instead of the default."""
    folder = Path(folder)
    if CHECKPOINT_FOLDER.match(folder.name) and (folder / "trainer_state.json").exists():
        run_dir, given = folder.parent, folder
    else:
        run_dir, given = folder, None
    steps = _checkpoint_steps(run_dir)
    states = [run_dir / f"checkpoint-{s}" / "trainer_state.json" for s in steps]
    if given is None and not (run_dir / "trainer_state.json").exists() and not any(p.exists() for p in states):
        if checkpoint is not None:
            raise UsageError(f"--checkpoint {checkpoint}: {folder} is not a Trainer output directory (no "
                             "trainer_state.json at its root or in a checkpoint-N folder)")
        return None
    final = _holds_model(run_dir)
    if checkpoint is not None:
        if checkpoint not in steps:
            present = ", ".join(str(s) for s in steps) or "none"
            raise UsageError(f"--checkpoint {checkpoint}: {run_dir} has no checkpoint-{checkpoint} folder "
                             f"(checkpoints present: {present})")
        chosen = run_dir / f"checkpoint-{checkpoint}"
    elif given is not None:
        chosen = given
    elif final or not steps:
        chosen = run_dir
    else:
        chosen = run_dir / f"checkpoint-{steps[-1]}"
    return TrainerOutput(run_dir.resolve(), chosen.resolve(), steps, final)


@dataclasses.dataclass(repr=False)
class Target(Displayable):
    checkpoint: str  # as the user gave it
    model_dir: Path  # folder with config.json: the checkpoint, or the adapter's base
    adapter_dir: Path | None = None
    base: str | None = None  # the base as recorded or overridden (a string: it may be a path or a hub id)
    base_source: str | None = None  # "adapter_config.json" | "--base"
    recorded_base: str | None = None  # what adapter_config.json says, even when --base overrides it
    quant: str = "none"
    gpus: int = 1  # the GPUs one training process sees, as judged
    gpus_stated: bool = True  # False: the user did not say (--gpus absent): judged on 1, more GPUs a conditional warn
    setup: str = "plain"
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    device_map: Any = None
    max_memory: dict | None = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    allow_pickle: bool = False
    adapter_arg: str | None = None  # --adapter and --base as given, for re-resolving in a notebook kernel
    base_arg: str | None = None
    data: str | None = None  # --data: the training data (JSONL or a save_to_disk folder), notebook 07
    run: TrainerOutput | None = None  # CKPT is (or sits in) a Trainer output_dir: notebook 08
    training_args: str | None = None  # --training-args: a YAML/JSON file of TrainingArguments fields, notebook 09
    # a Trainer output_dir whose model cannot be resolved (its adapter's base unreachable, say): why, in one line.
    # The run autopsy (notebook 08) needs no model and still runs; the notebooks that load one say skip.
    model_unavailable: str | None = None

    @property
    def name(self) -> str:
        """A short, filesystem-safe name for the report folder."""
        leaf = (self.adapter_dir or self.model_dir).name or "checkpoint"
        if self.run is None and is_hub_id(self.checkpoint):  # a hub snapshot's folder is named by its commit
            leaf = self.checkpoint.rsplit("/", 1)[-1]
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", leaf)[:60]

    def require_model(self) -> None:
        """UsageError (exit 2) when the model cannot be resolved: for what needs it (census, panel, model notebooks)."""
        if self.model_unavailable:
            raise UsageError(self.model_unavailable)

    @property
    def base_fix(self) -> str:
        """How to point the workbench at the model when its base cannot be resolved, in the run's own names."""
        named = f" (a local copy of {self.recorded_base})" if self.recorded_base else ""
        return (f"Pass --base DIR{named}: `workbench diagnose {self.checkpoint} --base /path/to/base`; or make the "
                "hub id reachable (network, or HF_HOME holding its snapshot).")

    def as_contract(self) -> dict[str, Any]:
        """The `target` object of findings.json."""
        contract = {"checkpoint": self.checkpoint, "model_dir": str(self.model_dir),
                    "adapter": str(self.adapter_dir) if self.adapter_dir else None, "base": self.base,
                    "base_source": self.base_source, "quant": self.quant, "gpus": self.gpus if self.gpus_stated else None,
                    "setup": self.setup}
        if self.run is not None:
            contract["run"] = self.run.describe()
        if self.model_unavailable:
            contract["model_unavailable"] = self.model_unavailable
        return contract

    def options(self) -> dict[str, Any]:
        """The options that resolve to this target again (`resolve_target(**target.options())`), as the notebook
        contract passes them: JSON-safe, local paths absolute (a kernel may run in another folder)."""
        def absolute(ref: str | None) -> str:
            return str(Path(ref).resolve()) if ref and Path(ref).exists() else (ref or "")

        # a run's checkpoint is passed as its folder: it resolves to the same checkpoint of the same run
        checkpoint = str(self.run.folder) if self.run is not None else absolute(self.checkpoint)
        return {
            "checkpoint": checkpoint, "adapter": absolute(self.adapter_arg),
            "base": absolute(self.base_arg), "quant": self.quant, "gpus": self.gpus if self.gpus_stated else 0,
            "setup": self.setup,
            "device_map": json.dumps(self.device_map) if isinstance(self.device_map, dict) else
            str(self.device_map if self.device_map is not None else ""),
            "max_memory": ",".join(f"{k}={v}" for k, v in (self.max_memory or {}).items()),
            "dtype": self.dtype, "params_json": json.dumps(self.params),
            "trust_remote_code": self.trust_remote_code, "allow_pickle": self.allow_pickle,
            "data": absolute(self.data), "training_args": absolute(self.training_args),
        }

    def view(self):
        from workbench.display.nodes import Code, Display, Table

        rows = [[k, Code(v)] for k, v in self.as_contract().items() if v not in (None, "")]
        return Display(Table(None, rows, row_headers=True, left=True))


def resolve_local(ref: str, *, what: str, relative_to: Path | None = None, hub: str = "cache") -> Path:
    """A local folder for `ref`: a path, a path relative to `relative_to`, or a hub id (`hub`: how to reach it,
    `workbench.model.hub.HUB_MODES`)."""
    path = Path(ref).expanduser()
    candidates = [path] + ([relative_to / ref] if relative_to is not None and not path.is_absolute() else [])
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
        if candidate.exists():
            raise UsageError(f"{what} {ref} is a file; pass the folder that holds config.json and the weights")
    if HUB_ID.match(ref):
        return resolve_hub(ref, what=what, mode=hub)
    raise UsageError(f"{what} {ref} does not exist; check the path")


def parse_max_memory(spec: str | dict | None) -> dict | None:
    """accelerate's format: '0=20GiB,1=20GiB,cpu=64GiB' -> {0: '20GiB', 1: '20GiB', 'cpu': '64GiB'}."""
    if not spec:
        return None
    if isinstance(spec, dict):
        return spec
    out: dict[Any, str] = {}
    for part in str(spec).split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not value or not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B|B)?", value.strip(), re.I):
            raise UsageError(f"--max-memory {spec!r}: expected DEVICE=SIZE pairs like 0=20GiB,1=20GiB,cpu=64GiB")
        key = key.strip()
        out[int(key) if key.isdigit() else key] = value.strip()
    return out


def parse_device_map(spec: str | dict | None) -> Any:
    if spec in (None, ""):
        return None
    if isinstance(spec, dict):
        return spec
    if spec in ("auto", "balanced", "balanced_low_0", "sequential", "cpu") or spec.isdigit():
        return int(spec) if spec.isdigit() else spec
    try:
        return json.loads(spec)
    except json.JSONDecodeError:
        raise UsageError(f"--device-map {spec!r}: use auto, balanced, sequential, cpu, a GPU index, "
                         "or a JSON object") from None


def resolve_target(checkpoint: str, *, adapter: str | None = None, base: str | None = None, quant: str = "none",
                   gpus: int | str | None = None, setup: str | None = None, params: dict | None = None,
                   device_map: Any = None, max_memory: Any = None, dtype: str = "auto",
                   trust_remote_code: bool = False, params_json: str | None = None,
                   allow_pickle: bool = False, headers_only: bool = False, data: str | None = None,
                   run_checkpoint: int | None = None, training_args: str | None = None,
                   hub: str = "cache") -> Target:
    """Resolve the user's arguments into a Target; every unusable input raises UsageError (exit 2).

    `headers_only`: the caller reads files and headers alone (the census), or has them checked elsewhere (the CLI's
    kernel: `check_with_the_stack`); the set-up and the architecture are not checked, so neither torch nor
    transformers is imported. `run_checkpoint`: the step of the checkpoint-N to
    diagnose when CKPT is a Trainer output directory (default: its final save, else its latest checkpoint).
    `hub`: how hub ids are reached ("cache", "headers", "download"; `workbench.model.hub`)."""

    if params_json:
        params = json.loads(params_json)
    if not checkpoint:
        raise UsageError("no checkpoint given; pass a checkpoint folder (or run `make diagnose` for the demo)")
    if quant not in QUANTS:
        raise UsageError(f"--quant {quant!r}: use one of {', '.join(QUANTS)}")
    gpus_stated = gpus not in (None, "", 0, "0")  # 0: the notebook contract's "not stated"
    try:
        gpus = int(gpus) if gpus_stated else 1
    except (TypeError, ValueError):
        raise UsageError(f"--gpus {gpus!r}: expected a whole number of GPUs, 1 or more") from None
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: the training process must see at least 1 GPU to diagnose; use 1 or more")
    if gpus > MAX_GPUS_PER_PROCESS:
        raise UsageError(f"--gpus {gpus}: one training process sees the GPUs of one node (at most "
                         f"{MAX_GPUS_PER_PROCESS}); for more, diagnose one node and launch with torchrun")
    if data and not Path(data).expanduser().exists():
        raise UsageError(f"--data {data} does not exist; pass a JSONL file or a folder saved with "
                         "datasets.save_to_disk")
    if training_args and not Path(training_args).expanduser().is_file():
        raise UsageError(f"--training-args {training_args} does not exist; pass a YAML or JSON file of "
                         "TrainingArguments fields")
    folder = resolve_local(checkpoint, what="checkpoint", hub=hub)
    run = find_trainer_output(folder, run_checkpoint)
    if run is not None:
        folder = run.folder
        if not _holds_model(folder):
            raise UsageError(f"{folder} ({run.describe()}) holds neither config.json nor adapter_config.json: "
                             "nothing saved to diagnose; pass --checkpoint N for a checkpoint that holds a save")
    adapter_dir = None
    recorded = None
    base_source = None
    if (folder / "adapter_config.json").exists():
        if adapter:
            raise UsageError(f"{checkpoint} is itself an adapter (it holds adapter_config.json); drop --adapter")
        adapter_dir = folder
    elif adapter:
        adapter_dir = resolve_local(adapter, what="adapter", hub=hub)
        if not (adapter_dir / "adapter_config.json").exists():
            raise UsageError(f"adapter {adapter} holds no adapter_config.json; pass a PEFT adapter folder")
    if adapter_dir is not None:
        try:
            adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{adapter_dir}/adapter_config.json is not valid JSON ({exc})") from None
        recorded = adapter_config.get("base_model_name_or_path")
    try:
        model_dir, base_ref, base_source = _model_folder(checkpoint, folder, adapter_dir, base, recorded, hub,
                                                         allow_pickle)
    except UsageError as exc:
        if run is None:
            raise
        # the run's own files still tell its story: notebook 08 needs no model
        return Target(checkpoint=checkpoint, model_dir=folder, adapter_dir=adapter_dir, base=base or recorded,
                      base_source="--base" if base else "adapter_config.json" if recorded else None,
                      recorded_base=recorded, quant=quant, gpus=gpus, gpus_stated=gpus_stated, setup=setup or "plain",
                      params=params or {}, dtype=dtype or "auto", trust_remote_code=trust_remote_code,
                      allow_pickle=allow_pickle, adapter_arg=adapter or None, base_arg=base or None,
                      data=str(Path(data).expanduser()) if data else None, run=run,
                      training_args=str(Path(training_args).expanduser()) if training_args else None,
                      model_unavailable=str(exc))
    if not headers_only:
        check_with_the_stack(setup, model_dir, trust_remote_code)
    return Target(checkpoint=checkpoint, model_dir=model_dir, adapter_dir=adapter_dir, base=base_ref,
                  base_source=base_source, recorded_base=recorded, quant=quant, gpus=gpus, gpus_stated=gpus_stated,
                  setup=setup or "plain",
                  params=params or {}, device_map=parse_device_map(device_map),
                  max_memory=parse_max_memory(max_memory), dtype=dtype or "auto",
                  trust_remote_code=trust_remote_code, allow_pickle=allow_pickle, adapter_arg=adapter or None,
                  base_arg=base or None, data=str(Path(data).expanduser()) if data else None, run=run,
                  training_args=str(Path(training_args).expanduser()) if training_args else None)


def check_with_the_stack(setup: str | None, model_dir: Path, trust_remote_code: bool = False) -> None:
    """What only the stack can tell about a target, as UsageError: a --setup that does not import, an architecture
    transformers does not know. Imports torch and transformers: the CLI asks its kernel (`Kernel.check_target`)."""
    from workbench.model.setups import resolve_setup

    resolve_setup(setup)  # a --setup that does not import fails here, before any notebook starts
    if not setup or setup == "plain":
        from workbench.model.loading import auto_config

        auto_config(model_dir, trust_remote_code=trust_remote_code)  # unknown architectures fail here, clearly


def _model_folder(checkpoint: str, folder: Path, adapter_dir: Path | None, base: str | None, recorded: str | None,
                  hub: str, allow_pickle: bool) -> tuple[Path, str | None, str | None]:
    """(the folder with config.json and the weights, the base as referred to, where that reference came from);
    UsageError when it cannot be found or holds no usable weights."""
    from workbench.model.checkpoint import inspect_checkpoint

    if adapter_dir is not None and adapter_dir == folder:
        if base:
            base_ref, base_source = base, "--base"
        elif recorded:
            base_ref, base_source = recorded, "adapter_config.json"
        else:
            raise UsageError(f"{adapter_dir}/adapter_config.json names no base_model_name_or_path; pass --base")
        model_dir = resolve_local(base_ref, what=f"the adapter's base ({base_source})", relative_to=adapter_dir,
                                  hub=hub)
    else:
        if base:
            raise UsageError("--base applies to an adapter; CKPT is a full checkpoint (no adapter_config.json)")
        model_dir, base_ref = folder, (str(folder) if adapter_dir else None)
        base_source = "CKPT" if adapter_dir else None
    if not (model_dir / "config.json").exists():
        raise UsageError(f"{model_dir} holds neither config.json nor adapter_config.json: not a Hugging Face "
                         "checkpoint folder")
    inspection = inspect_checkpoint(model_dir)
    if not inspection.headers and not inspection.pickle_files:
        raise UsageError(f"{model_dir} holds config.json but no weights (model.safetensors or its shards); "
                         "copy the weight files in, or point at the folder that has them")
    if not inspection.headers and not allow_pickle:
        raise UsageError(f"{model_dir} holds only pickle weights ({', '.join(inspection.pickle_files)}); the "
                         "workbench does not unpickle checkpoints unless asked: convert them to safetensors, or pass "
                         "--allow-pickle (transformers then loads them with torch.load(weights_only=True))")
    return model_dir, base_ref, base_source


def config_folder(ckpt: str, base: str | None) -> Path:
    """The folder whose config.json describes CKPT's model: CKPT itself when it holds one (weights are not needed), else
    the model an adapter folder, a Trainer output_dir or a hub id resolves to (headers only, nothing loaded)."""
    folder = Path(ckpt).expanduser()
    if (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file() and not base:
        return folder
    target = resolve_target(ckpt, base=base, headers_only=True, hub="headers")
    target.require_model()
    return Path(target.model_dir)
