"""The training configuration notebook 09's checks judge: where it came from, and the arguments themselves.

`training_configuration_probe(target, prepared)` reads it from the first of:

1. the Trainer (or trl trainer) the set-up returned: `source="trainer"`, `args` is `trainer.args` (after the
   trainer's own __init__ adjusted it: trl's forcing of `use_reentrant`, `ddp_find_unused_parameters`), `trainer`
   is the trainer;
2. `--training-args FILE` (YAML or JSON of TrainingArguments fields): `source="file PATH"`; a file naming a trl
   config (`config_class: SFTConfig`) is built as that class;
3. the run's own record when the target is a Trainer output directory (notebook 08's reader: the model card,
   `training_args.bin` under --allow-pickle): `source="run record"`;
4. else the Trainer's defaults: `source="defaults"`, said in `assumed`.

`args` is always an instance of the installed `transformers.TrainingArguments` (or the trl config class the file
or trainer names), built by that class itself, so every check reads a field as the Trainer will (`args.fp16`,
`args.gradient_accumulation_steps`, `args.activation_checkpointing_kwargs`, `args.ddp_find_unused_parameters`,
`args.fsdp`, `args.fsdp_config`). `given` holds the fields the source set explicitly (the rest are the class's
defaults); `assumed` lists, in words, what was assumed rather than read. `launch` is how the run itself is launched
(its processes, mixed precision, FSDP), read from the Trainer's accelerator: known only when the Trainer is the one
training now (the training callback), else None (a set-up's Trainer may yet be launched under torchrun).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from workbench.display.nodes import Code, Display, Paragraph, Table
from workbench.display.result import Displayable
from workbench.errors import UsageError

# what a trl CLI config file (`trl sft --config FILE`) holds besides the trainer's config: TrlParser parses the
# script's and the model's arguments from the same file (trl/scripts/utils.py TrlParser)
TRL_SIDE_CLASSES = ("ScriptArguments", "ModelConfig")
CONFIG_CLASS_KEY = "config_class"
HOW_TO_GIVE = ("return your Trainer from the set-up (--setup module:function), pass --training-args FILE (YAML or "
               "JSON of TrainingArguments fields), or diagnose the run's output_dir")


@dataclasses.dataclass(frozen=True)
class RunLaunch:
    """How a running training was launched, as its Trainer's accelerator says."""

    processes: int  # accelerator.num_processes: 1 unless torchrun / accelerate launch started several
    mixed_precision: str  # accelerator.mixed_precision: "no", "fp16", "bf16", "fp8"
    fsdp: bool  # trainer.is_fsdp_enabled (from the arguments or an accelerate config)

    def describe(self) -> str:
        return (f"{self.processes} process{'es' if self.processes != 1 else ''}, mixed_precision="
                f"{self.mixed_precision!r}{', FSDP' if self.fsdp else ''} (your Trainer's accelerator)")


def launch_of(trainer) -> RunLaunch | None:
    """Read before any TrainingArguments is built in the process: building one resets accelerate's shared state,
    which `num_processes` and `mixed_precision` read (transformers 5.23 training_args.py:1872)."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None:
        return None
    return RunLaunch(accelerator.num_processes, str(accelerator.mixed_precision),
                     bool(getattr(trainer, "is_fsdp_enabled", False)))


@dataclasses.dataclass(frozen=True, repr=False)
class TrainingConfiguration(Displayable):
    """The training configuration as the checks read it (see the module docstring)."""

    source: str  # "trainer" | "file PATH" | "run record" | "defaults"
    args: Any  # a transformers.TrainingArguments (or trl config) instance
    trainer: Any = None  # the Trainer the set-up returned, else None
    assumed: tuple[str, ...] = ()  # what was assumed rather than read, in words
    given: dict[str, Any] = dataclasses.field(default_factory=dict)  # fields the source set explicitly
    launch: RunLaunch | None = None  # the running training's launch (the training callback), else not known

    @property
    def is_defaults(self) -> bool:
        return self.source == "defaults"

    def cite(self, field: str) -> str:
        """`field=value (where it came from)` for a finding's detail."""
        value = getattr(self.args, field, None)
        origin = self.source if field in self.given or self.source == "trainer" else f"the {type(self.args).__name__} default"
        return f"{field}={value!r} ({origin})"

    def view(self):
        rows = [[k, Code(repr(v))] for k, v in sorted(self.given.items())]
        blocks = [Paragraph("Training configuration from ", Code(self.source), f" ({type(self.args).__name__}",
                            f", {type(self.trainer).__name__}" if self.trainer is not None else "", ")")]
        if rows:
            blocks.append(Table(["field", "value"], rows, left=True))
        if self.launch is not None:
            blocks.append(Paragraph("Launched with ", self.launch.describe()))
        for line in self.assumed:
            blocks.append(Paragraph("Assumed: ", line))
        return Display(*blocks)


def config_classes() -> dict[str, type]:
    """The configuration classes a file may name: TrainingArguments and trl's *Config trainer configs."""
    import transformers

    classes: dict[str, type] = {"TrainingArguments": transformers.TrainingArguments,
                                "Seq2SeqTrainingArguments": transformers.Seq2SeqTrainingArguments}
    try:
        import trl
    except ImportError:
        return classes
    for name in dir(trl):
        if not name.endswith("Config") or name == "ModelConfig":
            continue
        try:
            cls = getattr(trl, name)
        except Exception:  # noqa: BLE001 - trl's lazy module raises for optional back-ends that are absent
            continue
        if isinstance(cls, type) and issubclass(cls, transformers.TrainingArguments):
            classes[name] = cls
    return classes


def _trl_side_fields() -> set[str]:
    try:
        import trl
    except ImportError:
        return set()
    fields: set[str] = set()
    for name in TRL_SIDE_CLASSES:
        cls = getattr(trl, name, None)
        if cls is not None and dataclasses.is_dataclass(cls):
            fields |= {f.name for f in dataclasses.fields(cls)}
    return fields


def read_training_args_file(path: str | Path) -> tuple[type, dict[str, Any]]:
    """(the configuration class, the fields it gets) from a YAML or JSON file; unknown fields, an unknown class or
    an unreadable file raise UsageError in one line, naming them."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"--training-args {path} does not exist; pass a YAML or JSON file of TrainingArguments fields")
    text = path.read_text(errors="replace")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the file's
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"--training-args {path}: not valid YAML/JSON ({first})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"--training-args {path}: expected a mapping of TrainingArguments fields, got "
                         f"{type(data).__name__}")
    data = dict(data)
    classes = config_classes()
    class_name = str(data.pop(CONFIG_CLASS_KEY, "TrainingArguments")).rsplit(".", 1)[-1]
    if class_name not in classes:
        raise UsageError(f"--training-args {path}: {CONFIG_CLASS_KEY}: {class_name} is not one of "
                         f"{', '.join(sorted(classes))}")
    cls = classes[class_name]
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    side = _trl_side_fields() if cls.__module__.startswith("trl") else set()
    unknown = sorted(set(data) - known - side)
    if unknown:
        raise UsageError(f"--training-args {path}: unknown {class_name} field(s) {', '.join(unknown)} "
                         f"(transformers {_version('transformers')}"
                         + (f", trl {_version('trl')}" if cls.__module__.startswith("trl") else "") + ")")
    return cls, {k: v for k, v in data.items() if k in known}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def build_arguments(cls: type, fields: dict[str, Any], what: str) -> Any:
    """`cls(**fields)`, with an output_dir of our own when none is given (nothing is written there); the class's
    own validation errors are the user's, in one line. The environment is left as found (an FSDP configuration's
    arguments write FSDP_CPU_RAM_EFFICIENT_LOADING into it: `runtime.environment_as_found`)."""
    from workbench.runtime import environment_as_found

    fields = dict(fields)
    fields.setdefault("output_dir", str(Path(tempfile.gettempdir()) / "workbench-trainer-output"))
    fields.setdefault("report_to", "none")
    fields.pop("tf32", None)
    try:
        with gpu_configuration(), environment_as_found():
            return cls(**fields)
    except (ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{what}: {cls.__name__} refuses these fields ({first})") from None


@contextlib.contextmanager
def gpu_configuration():
    """TrainingArguments built as on the GPU machine the configuration was written for: its __post_init__ asks this
    machine whether bf16 is available (transformers 5.23 training_args.py:1778 raises "Your setup doesn't support
    bf16/gpu"), which says nothing about the configuration itself. (`tf32` is left out of the build for the same
    reason, :1682: no check reads it.)"""
    from unittest import mock

    with mock.patch("transformers.training_args.is_torch_bf16_gpu_available", return_value=True):
        yield


def _run_record(target) -> tuple[dict[str, Any], dict[str, str]] | None:
    run = getattr(target, "run", None)
    if run is None:
        return None
    from workbench.model.run_configuration import run_configuration

    recorded = run_configuration(run.run_dir, run.folder, bool(getattr(target, "allow_pickle", False)))
    return (recorded.values, recorded.sources) if recorded.values else None


def training_configuration_probe(target, prepared=None) -> TrainingConfiguration:
    """The training configuration, from the first source that has one (see the module docstring)."""
    import transformers

    trainer = getattr(prepared, "trainer", None)
    if trainer is not None and getattr(trainer, "args", None) is not None:
        args = trainer.args
        defaults = None
        if dataclasses.is_dataclass(args):
            with gpu_configuration():
                defaults = type(args)(output_dir=args.output_dir, report_to="none")
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
                 if defaults is not None and f.init and f.name not in ("output_dir", "report_to")
                 and _differs(getattr(args, f.name), getattr(defaults, f.name))}
        return TrainingConfiguration("trainer", args, trainer, (), given, getattr(prepared, "launch", None))
    path = getattr(target, "training_args", None)
    if path:
        cls, fields = read_training_args_file(path)
        args = build_arguments(cls, fields, f"--training-args {path}")
        assumed = ("the Trainer is built from these arguments on the prepared model, with its default collator",)
        return TrainingConfiguration(f"file {path}", args, None, assumed, fields)
    record = _run_record(target)
    if record is not None:
        values, sources = record
        fields = {k: v for k, v in values.items()
                  if k in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}}
        args = build_arguments(transformers.TrainingArguments, fields, "the run's record")
        where = sorted(set(sources.values()))
        assumed = (f"fields the run recorded ({', '.join(where)}); every other field is the TrainingArguments "
                   "default",)
        return TrainingConfiguration("run record", args, None, assumed, fields)
    args = build_arguments(transformers.TrainingArguments, {}, "the Trainer's defaults")
    assumed = (f"no Trainer, no --training-args and no run record: the Trainer's defaults (transformers "
               f"{transformers.__version__}); for your own configuration, {HOW_TO_GIVE}",)
    return TrainingConfiguration("defaults", args, None, assumed, {})


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - tensors and other objects without a plain equality
        return a is not b
