"""What a member's saved files say, and what changed from one member to the next: the per-member numbers the
comparison plots (adapter update norm, loss at save, eval metrics) and, for the member at which a check turned
bad, the differences from the member before (adapter update norm per module, the run log's new entries, config,
tokenizer and dtype-census differences).

Read from the files alone (safetensors headers, the adapter's tensors, JSON), in the process that renders the page:
never a model load. A Trainer output_dir member is read where `diagnose` reads it (its final save, else its latest
checkpoint; the longest trainer_state.json of the run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any

from workbench.model.lora import read_json

CONFIG_FILES = ("config.json", "adapter_config.json", "generation_config.json")
# eval entries that are timing, not quality
EVAL_TIMING = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


@dataclasses.dataclass
class MemberFacts:
    name: str
    folder: str  # the folder read
    update_norms: dict[str, float]  # adapted module -> ‖B·A‖·scaling (NaN when the adapter holds NaN/inf)
    nonfinite: list[str]  # adapter tensors holding NaN/inf
    log: list[dict[str, Any]]  # trainer_state.json's log_history (empty: no run log)
    configs: dict[str, dict[str, Any]]  # file -> its keys, flattened (a.b for nested)
    tokenizer: dict[str, Any]  # the special tokens, added tokens, chat template digest
    dtypes: dict[str, int]  # dtype -> tensors, over every safetensors file of the folder

    @property
    def update_norm(self) -> float | None:
        """The whole adapter's update, √Σ‖B·A‖²·scaling² (None: no adapter)."""
        return math.sqrt(sum(v * v for v in self.update_norms.values())) if self.update_norms else None

    @property
    def loss_at_save(self) -> float | None:
        losses = [e["loss"] for e in self.log if isinstance(e.get("loss"), (int, float))]
        return float(losses[-1]) if losses else None

    @property
    def eval_metrics(self) -> dict[str, float]:
        """The last evaluation's metrics (timings left out)."""
        evals = [e for e in self.log if any(k.startswith("eval_") for k in e)]
        last = evals[-1] if evals else {}
        return {k: float(v) for k, v in last.items()
                if k.startswith("eval_") and k not in EVAL_TIMING and isinstance(v, (int, float))}


def read_facts(name: str, path: Path) -> MemberFacts:
    from workbench.model.target import find_trainer_output

    run = find_trainer_output(path)
    folder = run.folder if run is not None else path
    return MemberFacts(name, str(folder), *_adapter(folder), _log(folder, run), _configs(folder),
                       _tokenizer(folder), _dtypes(folder))


def _adapter(folder: Path) -> tuple[dict[str, float], list[str]]:
    from workbench.probes.run.adapter_progress import ADAPTER_FILE, read_checkpoint_adapter

    if not (folder / ADAPTER_FILE).is_file():
        return {}, []
    adapter = read_checkpoint_adapter(0, folder, component_of=lambda module: "adapter")
    return {m.module: m.update_norm for m in adapter.modules}, adapter.nonfinite


def _log(folder: Path, run) -> list[dict[str, Any]]:
    from workbench.probes.run.run_facts import longest_state
    from workbench.probes.run.trainer_state import read_state

    own = folder / "trainer_state.json"  # a checkpoint's log ends at its save; the root's at the run's end
    path = own if own.is_file() else longest_state(run.run_dir) if run is not None else None
    if path is None:
        return []
    try:
        return list(read_state(path).get("log_history") or [])
    except (OSError, ValueError):
        return []


def _configs(folder: Path) -> dict[str, dict[str, Any]]:
    return {name: flatten(data) for name in CONFIG_FILES if (data := read_json(folder / name)) is not None}


def _tokenizer(folder: Path) -> dict[str, Any]:
    config = read_json(folder / "tokenizer_config.json")
    if config is None:
        return {}
    facts = {k: _token_text(v) for k, v in config.items() if k.endswith("_token") or k == "model_max_length"}
    added = config.get("added_tokens_decoder") or {}
    facts["added tokens"] = {str(i): _token_text(t) for i, t in sorted(added.items(), key=lambda kv: int(kv[0]))}
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    facts["chat_template digest"] = hashlib.sha256(str(template).encode()).hexdigest()[:12] if template else None
    return flatten(facts)


def _token_text(value: Any) -> Any:
    return value.get("content") if isinstance(value, dict) else value


def _dtypes(folder: Path) -> dict[str, int]:
    from workbench.model.safetensors_header import HeaderError, read_header

    counts: dict[str, int] = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            header = read_header(path)
        except (OSError, HeaderError):
            continue
        for tensor in header.tensors:
            counts[f"{path.name}: {tensor.dtype}"] = counts.get(f"{path.name}: {tensor.dtype}", 0) + 1
    return counts


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# -- what changed -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Change:
    what: str  # "adapter", "run log", "config.json", "tokenizer", "dtypes", ...
    key: str
    before: Any
    after: Any


def changes(before: MemberFacts, after: MemberFacts) -> list[Change]:
    """Every difference between two members' files, adapter modules first."""
    found = _adapter_changes(before, after)
    last_step = max((e.get("step", 0) for e in before.log), default=-1)
    found += [Change("run log", f"step {e.get('step')}", None, _entry_text(e))
              for e in after.log if e.get("step", 0) > last_step]
    for name in sorted(set(before.configs) | set(after.configs)):
        found += _dict_changes(name, before.configs.get(name, {}), after.configs.get(name, {}))
    found += _dict_changes("tokenizer", before.tokenizer, after.tokenizer)
    found += _dict_changes("dtypes", before.dtypes, after.dtypes)
    return found


def _adapter_changes(before: MemberFacts, after: MemberFacts) -> list[Change]:
    out = [Change("adapter", f"{t} (NaN/inf)", None, "non-finite") for t in after.nonfinite
           if t not in before.nonfinite]
    for module in sorted(set(before.update_norms) | set(after.update_norms)):
        a, b = before.update_norms.get(module), after.update_norms.get(module)
        if a != b and not (a is not None and b is not None and math.isnan(a) and math.isnan(b)):
            out.append(Change("adapter", f"{module} ‖B·A‖·scaling", a, b))
    return out


def _dict_changes(what: str, before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    missing = object()
    return [Change(what, key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after))
            if before.get(key, missing) != after.get(key, missing)]


def _entry_text(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items() if k != "step")
