"""Which trainer wrote a run: trl's DPO, KTO, ORPO, CPO, GRPO, RLOO, Online DPO, reward model, or a plain
(SFT) Trainer run, with the evidence, so that notebook 08 reads each run by its own signals.

Read in order (`trl_trainers.yaml`, trl 1.16.0): the class of the run's `training_args.bin`, taken from the
pickle's opcodes (`pickled_args`: nothing is imported or executed, the file is never unpickled); the tags of
its model card (trl's `create_model_card` adds the trainer's `_tag_names`); the keys its log holds.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).with_name("trl_trainers.yaml")
FAMILIES = ("preference", "online_rl", "reward", "sft")


@dataclasses.dataclass(frozen=True)
class Trainer:
    key: str
    name: str
    family: str
    config: str
    tag: str
    keys: tuple[str, ...]
    distinct: tuple[str, ...]
    source: str


@dataclasses.dataclass(frozen=True)
class RunKind:
    """The trainer (or trainers the evidence cannot tell apart, all of one family) and how it was recognised."""

    family: str  # preference | online_rl | reward | sft
    trainers: tuple[str, ...]  # keys of trl_trainers.yaml; () for a plain Trainer run
    evidence: str
    args: dict[str, Any] = dataclasses.field(default_factory=dict)  # training_args.bin's plain fields
    args_file: str | None = None  # where `args` were read

    def arg(self, key: str, default: Any = None) -> Any:
        return self.args.get(key, default)

    def cite(self, key: str) -> str:
        """'max_completion_length=16 (training_args.bin)', or 'max_completion_length (not recorded)'."""
        return f"{key}={self.args[key]!r} ({self.args_file})" if key in self.args else f"{key} (not recorded)"

    @property
    def name(self) -> str:
        names = [trainers()[t].name for t in self.trainers]
        return " or ".join(names) if names else "Trainer"

    @property
    def is_sft(self) -> bool:
        return self.family == "sft"


@functools.cache
def trainers() -> dict[str, Trainer]:
    data = yaml.safe_load(DATA.read_text())
    return {key: Trainer(key, t["name"], t["family"], t["config"], t["tag"], tuple(t.get("keys") or ()),
                         tuple(t.get("distinct") or ()), f"{data['release']} {t['source']}")
            for key, t in data["trainers"].items()}


def release() -> str:
    return yaml.safe_load(DATA.read_text())["release"]


_TAGS = re.compile(r"^tags:\s*\n((?:\s*-\s*.+\n)+)", re.M)


def card_tags(readme: Path) -> set[str]:
    """The `tags:` list of a model card's YAML front matter."""
    try:
        text = readme.read_text(errors="replace")
    except OSError:
        return set()
    if not text.startswith("---"):
        return set()
    front = text.split("---", 2)[1] if text.count("---") >= 2 else ""
    match = _TAGS.search(front + "\n")
    return {t.strip().strip("'\"") for t in re.findall(r"-\s*(.+)", match.group(1))} if match else set()


def _by_keys(keys: set[str]) -> tuple[str, ...]:
    """The trainers whose every key the log holds; a trainer with distinct keys (CPO's nll_loss, ORPO's
    log_odds_ratio, Online DPO's val/contain_eos_token) only when those are there, and then it wins over the
    trainers it shares keys with (CPO logs all of DPO's); a trainer with no keys (SFT) never matches."""
    found = [t for t in trainers().values() if t.keys and set(t.keys) <= keys and set(t.distinct) <= keys]
    distinct = [t for t in found if t.distinct]
    most = max((len(t.distinct) for t in distinct), default=0)
    return tuple(t.key for t in ([t for t in distinct if len(t.distinct) == most] or found))


def _by_tags(tags: set[str]) -> list[Trainer]:
    """The trainers a card's tags name; of two where one tag contains the other ('online-dpo', 'dpo'), the longer."""
    named = [t for t in trainers().values() if t.tag in tags]
    return [t for t in named if not any(t.tag != o.tag and t.tag in o.tag for o in named)]


def run_kind(folders: list[Path], logged_keys: set[str]) -> RunKind:
    """The run's trainer from its saved files (`folders`: the output_dir and the save diagnosed) and log keys."""
    from workbench.probes.run.pickled_args import read_pickled_args

    by_config = {t.config: t for t in trainers().values()}
    args: dict[str, Any] = {}
    args_file = None
    for folder in folders:
        pickled = folder / "training_args.bin"
        read = read_pickled_args(pickled) if pickled.exists() else None
        if read is None:
            continue
        args, args_file = read.fields, f"{folder.name}/training_args.bin"
        trainer = by_config.get(read.cls.rsplit(".", 1)[-1])
        if trainer is not None:
            return RunKind(trainer.family, (trainer.key,) if trainer.family != "sft" else (),
                           f"{args_file} holds a {read.cls} (read from its opcodes, not unpickled)", args, args_file)
        break
    for folder in folders:
        tags = card_tags(folder / "README.md")
        named = _by_tags(tags)
        if len(named) == 1:  # two trainers named (a card carried over): the keys decide
            trainer = named[0]
            return RunKind(trainer.family, (trainer.key,) if trainer.family != "sft" else (),
                           f"{folder.name}/README.md tags: {', '.join(sorted(tags))}", args, args_file)
    matched = _by_keys(logged_keys)
    families = {trainers()[k].family for k in matched}
    if len(families) == 1:
        shown = sorted({k for t in matched for k in trainers()[t].keys})
        return RunKind(families.pop(), matched, f"the log holds {', '.join(shown[:6])}", args, args_file)
    return RunKind("sft", (), "no trl trainer's keys in the log, no trl tag in the model card", args, args_file)


def live_run_kind(args, logged_keys: set[str]) -> RunKind:
    """The run's trainer from the live arguments' class (`WorkbenchCallback`'s autopsy), else from the log's keys;
    its plain fields as `args` (credentials left out, as `pickled_args` leaves them)."""
    from workbench.probes.run.pickled_args import plain_fields

    fields = plain_fields({f.name: getattr(args, f.name, None) for f in dataclasses.fields(args)})
    cls = type(args).__name__
    trainer = next((t for t in trainers().values() if t.config == cls), None)
    if trainer is not None:
        return RunKind(trainer.family, (trainer.key,) if trainer.family != "sft" else (),
                       f"the live Trainer's arguments are a {cls}", fields, "the live TrainingArguments")
    found = run_kind([], logged_keys)
    return dataclasses.replace(found, args=fields, args_file="the live TrainingArguments")
