"""What a checkpoint folder holds, whether it is whole, and its dtype census read from headers alone.

`inspect_checkpoint` reads only safetensors headers (bytes counted in `bytes_read`): files present, shards
listed in the index and present, headers that parse, data regions that match the header. `static_census`
then splits the header tensors into components using a meta-device skeleton of the model.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.safetensors_header import FLOATING_DTYPES, HeaderError, SafetensorsHeader, read_header

INDEX_NAMES = ("model.safetensors.index.json", "adapter_model.safetensors.index.json")
SINGLE_NAMES = ("model.safetensors", "adapter_model.safetensors")
PICKLE_GLOBS = ("pytorch_model*.bin", "adapter_model.bin", "*.pt", "*.pth", "*.ckpt")
# what a Trainer saves beside the weights in each checkpoint-N/ (transformers.trainer: OPTIMIZER_NAME, SCHEDULER_NAME,
# SCALER_NAME, _save_rng_state): the run's state, pickled, never weights
TRAINER_STATE_GLOBS = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "rng_state_*.pth")


@dataclasses.dataclass
class CheckpointInspection:
    folder: Path
    kind: str  # "model" | "adapter" | "unknown"
    config: dict[str, Any] | None
    adapter_config: dict[str, Any] | None
    headers: list[SafetensorsHeader]
    pickle_files: list[str]
    problems: list[str]  # make the checkpoint unusable or wrong: fail
    warnings: list[str]  # odd but loadable: warn
    hub: str | None = None  # "ORG/NAME@COMMIT": weights left on the hub, headers read by HTTP range requests
    fixes: list[str] = dataclasses.field(default_factory=list)  # one per warning, naming the folder's own files

    @property
    def bytes_read(self) -> int:
        return sum(h.bytes_read for h in self.headers)

    @property
    def weight_bytes(self) -> int:
        return sum(h.data_size for h in self.headers)

    @property
    def tensor_count(self) -> int:
        return sum(len(h.tensors) for h in self.headers)

    def findings(self) -> list[Finding]:
        files = [h.path.name for h in self.headers] + self.pickle_files
        evidence = {"folder": str(self.folder), "kind": self.kind, "files": files, "tensors": self.tensor_count,
                    "weight_bytes": self.weight_bytes, "header_bytes_read": self.bytes_read,
                    "problems": self.problems, "warnings": self.warnings}
        if self.hub:
            evidence["hub"] = self.hub
        if self.problems:
            return [Finding("checkpoint.integrity", "fail", f"Checkpoint is damaged: {self.problems[0]}",
                            "; ".join(self.problems[:10]), evidence,
                            "Re-download or re-save the checkpoint (save_pretrained); do not train or evaluate on it "
                            "until this check passes.")]
        if self.warnings:
            return [Finding("checkpoint.integrity", "warn", f"Checkpoint loads, with oddities: {self.warnings[0]}",
                            "; ".join(self.warnings[:10]), evidence,
                            " ".join(self.fixes) or "Remove stray or duplicate weight files so that every loader "
                            "reads the same tensors.")]
        return [Finding("checkpoint.integrity", "pass", "Checkpoint files are complete and consistent",
                        f"{len(files)} weight file(s), {self.tensor_count} tensors, {self.weight_bytes:,} bytes of "
                        f"weights; headers read: {self.bytes_read:,} bytes"
                        + (f" over HTTP from the hub ({self.hub}; no weight downloaded)." if self.hub else "."),
                        evidence)]


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name} is not valid JSON ({exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name} is not a JSON object")
        return None
    return data


def inspect_checkpoint(folder: str | Path) -> CheckpointInspection:
    """The folder's files, shards and headers. A hub snapshot fetched without its weights (`workbench.model.hub`)
    counts the files the hub holds as present and reads their headers from the range requests' record."""
    from workbench.model.hub import remote_weights

    folder = Path(folder)
    problems: list[str] = []
    warnings: list[str] = []
    fixes: list[str] = []
    config = _read_json(folder / "config.json", problems)
    adapter_config = _read_json(folder / "adapter_config.json", problems)
    kind = "adapter" if adapter_config is not None else "model" if config is not None else "unknown"
    remote = remote_weights(folder)
    names = {p.name for p in folder.iterdir() if p.is_file()} if folder.is_dir() else set()
    if remote is not None:
        names |= {n for n in remote.files if "/" not in n}

    def matching(pattern: str) -> set[str]:
        return set(fnmatch.filter(names, pattern))

    files: list[Path] = []
    index_name = next((n for n in INDEX_NAMES if n in names), None)
    listed: dict[str, str] = {}
    if index_name is not None:
        index = _read_json(folder / index_name, problems) or {}
        listed = index.get("weight_map") or {}
        if not isinstance(listed, dict) or not listed:
            problems.append(f"{index_name} has no weight_map")
            listed = {}
        for shard in sorted(set(listed.values())):
            if shard in names:
                files.append(folder / shard)
            else:
                missing = sum(1 for s in listed.values() if s == shard)
                problems.append(f"shard {shard} is listed in {index_name} ({missing} tensors) but missing")
        strays = matching("*.safetensors") - set(listed.values())
        if strays:
            warnings.append(f"safetensors files not in the index (ignored by from_pretrained): {sorted(strays)}")
            fixes.append(f"Remove {', '.join(sorted(strays))} from {folder} (or list their tensors in {index_name}): "
                         "from_pretrained reads only the indexed shards, other loaders may read these too.")
    else:
        files = [folder / n for n in SINGLE_NAMES if n in names]
        others = sorted(folder / n for n in matching("*.safetensors") if folder / n not in files)
        if not files and others:
            files = others
            warnings.append(f"safetensors files without an index under non-standard names: {[p.name for p in others]}")
            fixes.append(f"Re-save {folder} with save_pretrained (one model.safetensors, or shards with their index) "
                         f"instead of {', '.join(p.name for p in others)}.")

    pickle_files = sorted({n for g in PICKLE_GLOBS for n in matching(g)}
                          - {n for g in TRAINER_STATE_GLOBS for n in matching(g)})
    if pickle_files and files:
        warnings.append(f"both safetensors and pickle weights present ({pickle_files}); transformers reads the "
                        "safetensors ones")
        fixes.append(f"Remove {', '.join(pickle_files)} from {folder}: transformers reads the safetensors weights, "
                     "a loader that reads the pickle ones (torch.load, older converters) may get other tensors.")

    headers: list[SafetensorsHeader] = []
    for path in files:
        try:
            header = read_header(path) if path.exists() or remote is None else remote.header(folder, path.name)
        except HeaderError as exc:
            problems.append(str(exc).replace(str(folder) + "/", ""))
            continue
        if header is None:
            problems.append(f"{path.name}: on the hub ({remote.repo_id}@{remote.commit[:12]}) but its header was not "
                            "read; run `workbench census` on the hub id again, or pass --download")
            continue
        headers.append(header)
        problems.extend(f"{path.name}: {p}" for p in header.problems)

    if listed:
        present = {t.name: h.path.name for h in headers for t in h.tensors}
        for name, shard in listed.items():
            if shard in {h.path.name for h in headers} and present.get(name) != shard:
                problems.append(f"{name} is mapped to {shard} by the index but that shard does not hold it")
                break
    if not files and not pickle_files:
        problems.append("no weight files (model.safetensors, its shards, adapter_model.safetensors or *.bin)")
    hub = f"{remote.repo_id}@{remote.commit}" if remote is not None else None
    return CheckpointInspection(folder, kind, config, adapter_config, headers, pickle_files, problems, warnings, hub,
                                fixes)


@dataclasses.dataclass(repr=False)
class StaticCensus(ProbeResult):
    """Per component and dtype: tensor count, elements, bytes, straight from the headers."""

    rows: list[dict[str, Any]]
    bytes_read: int
    unmapped: list[str]  # checkpoint keys that matched no module of the model skeleton
    key_mapping: str  # how checkpoint keys were mapped to module paths
    tied: dict[str, str] = dataclasses.field(default_factory=dict)  # alias -> canonical, counted once
    saved_twice: list[str] = dataclasses.field(default_factory=list)  # aliases saved beside their canonical tensor

    def tied_note(self) -> str:
        if not self.tied:
            return ""
        from workbench.model.tied import tied_notes

        note = "tied (counted once): " + "; ".join(tied_notes(self.tied))
        if self.saved_twice:
            note += (f"; saved twice: {', '.join(self.saved_twice[:8])} (from_pretrained ties them only if the "
                     "values are equal)")
        return note

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["source", "component", "dtype", "tensors", "elements", "bytes"])

    def details(self):
        from workbench.display.nodes import Display, Paragraph, Table

        return Display(Paragraph(f"Read {self.bytes_read:,} header bytes; no weight was loaded. Keys mapped via "
                                 f"{self.key_mapping}."), Paragraph(self.tied_note()) if self.tied else None,
                       Table.from_frame(self.to_frame()))

    def dtypes_by_component(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for r in self.rows:
            out[r["component"]][r["dtype"]] = out[r["component"]].get(r["dtype"], 0) + r["tensors"]
        return dict(out)


def checkpoint_key_mapper(skeleton) -> tuple[Callable[[str], str], str]:
    """Map checkpoint keys to the model's module paths with transformers' own conversion mapping.

    transformers 5 saves Qwen2-VL in the legacy layout (`model.layers.*`, `visual.*`) and renames on load
    (`model.language_model.layers.*`, `model.visual.*`); asking it keeps the split right across releases.
    """
    model_keys = dict.fromkeys(skeleton.state_dict().keys())
    try:
        import transformers
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(skeleton)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        how = f"transformers {transformers.__version__} conversion mapping ({len(transforms)} rules)"
    except Exception:  # noqa: BLE001 - an older/newer transformers without this API: identity mapping
        return (lambda key: key), "identity (this transformers release exposes no conversion mapping)"

    def map_key(key: str) -> str:
        renamed, _ = rename_source_key(key, renamings, converters, skeleton.base_model_prefix, model_keys)
        if renamed not in model_keys and key in model_keys:
            return key
        return renamed

    return map_key, how


def static_census(inspection: CheckpointInspection, classify: Callable[[str], str] | None = None,
                  map_key: Callable[[str], str] | None = None, key_mapping: str = "identity",
                  source: str | None = None, tied: dict[str, str] | None = None) -> StaticCensus:
    """`tied` (alias -> canonical, from the skeleton) counts a tied tensor once, under its canonical name's
    component, whether the checkpoint saved the canonical key, the alias, or both."""
    map_key = map_key or (lambda k: k)
    tied = tied or {}
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    unmapped: list[str] = []
    saved = {map_key(t.name) for header in inspection.headers for t in header.tensors}
    saved_twice: list[str] = []
    for header in inspection.headers:
        for t in header.tensors:
            name = map_key(t.name)
            if name in tied and tied[name] in saved:
                saved_twice.append(name)
                continue
            name = tied.get(name, name)
            component = classify(name) if classify else "other"
            if classify and component == "other" and name == t.name:
                unmapped.append(t.name)
            row = totals[(component, t.dtype)]
            row[0] += 1
            row[1] += t.numel
            row[2] += t.nbytes
    src = source or inspection.kind
    rows = [{"source": src, "component": c, "dtype": d, "tensors": n, "elements": e, "bytes": b}
            for (c, d), (n, e, b) in sorted(totals.items())]
    relevant = {a: c for a, c in tied.items() if a in saved or c in saved}
    return StaticCensus(rows, inspection.bytes_read, unmapped[:50], key_mapping, relevant, saved_twice)


def floating(dtype: str) -> bool:
    return dtype in FLOATING_DTYPES
