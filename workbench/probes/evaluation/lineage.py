"""`adapter.base_model`: was the adapter put on the base it was trained on?

`PeftModel.from_pretrained(model, adapter)` never checks which base it was given. A two-stage recipe
trained its stage-2 LoRA on stage 1 (vision tower fine-tuned) and was evaluated on the original base: it loaded,
ran, and scored IoU 0.62 instead of 0.84. This probe compares the base recorded in `adapter_config.json`
(`base_model_name_or_path`, `revision`) with the base actually loaded, and goes past PEFT:

- target-module shapes: every `lora_A` / `lora_B` against the base module it wraps, on a meta-device skeleton of
  the loaded base (no weight read);
- which components differ between the recorded and the loaded base, from sampled bytes of each tensor (the first
  and last 4 KiB: a fine-tune changes every element, so a sample sees it; a 7B base costs a few MB of reads);
- the lineage chain (reference base ⇢ recorded base → adapter), drawn as a small graph.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.errors import UsageError
from workbench.findings import Finding
from workbench.model.checkpoint import CheckpointInspection, checkpoint_key_mapper, inspect_checkpoint
from workbench.model.components import ComponentClassifier
from workbench.model.lora import adapter_shape_mismatches

SAMPLE_BYTES = 4096


def sampled_fingerprints(inspection: CheckpointInspection) -> dict[str, str]:
    """tensor name -> hash of its dtype, shape and the first and last SAMPLE_BYTES of its data."""
    out: dict[str, str] = {}
    for header in inspection.headers:
        data_start = 8 + header.header_size
        with open(header.path, "rb") as fh:
            for t in header.tensors:
                digest = hashlib.blake2b(f"{t.dtype}{t.shape}".encode(), digest_size=12)
                fh.seek(data_start + t.start)
                digest.update(fh.read(min(SAMPLE_BYTES, t.nbytes)))
                if t.nbytes > SAMPLE_BYTES:
                    fh.seek(data_start + max(t.start + SAMPLE_BYTES, t.end - SAMPLE_BYTES))
                    digest.update(fh.read(min(SAMPLE_BYTES, t.nbytes - SAMPLE_BYTES)))
                out[t.name] = digest.hexdigest()
    return out


def component_differences(a: Path, b: Path, classify, map_key) -> dict[str, dict[str, int]]:
    """Per component: tensors identical / different (in sampled bytes) / only in one of two full checkpoints."""
    fa, fb = sampled_fingerprints(inspect_checkpoint(a)), sampled_fingerprints(inspect_checkpoint(b))
    out: dict[str, dict[str, int]] = {}
    for key in sorted(set(fa) | set(fb)):
        row = out.setdefault(classify(map_key(key)), {"identical": 0, "different": 0, "only_in_one": 0})
        if key not in fa or key not in fb:
            row["only_in_one"] += 1
        else:
            row["identical" if fa[key] == fb[key] else "different"] += 1
    return out


def describe_differences(diff: dict[str, dict[str, int]]) -> str:
    same = [c for c, r in diff.items() if r["different"] == r["only_in_one"] == 0]
    changed = [f"{c} ({r['different'] + r['only_in_one']} tensors)" for c, r in diff.items() if c not in same]
    if not changed:
        return "identical weights (sampled)"
    return "differ in " + ", ".join(changed) + ("; identical: " + ", ".join(same) if same else "")


@dataclasses.dataclass
class ChainNode:
    label: str
    kind: str  # "reference" | "base" | "adapter" | "loaded"
    path: str


@dataclasses.dataclass(repr=False)
class LineageResult(ProbeResult):
    adapter: str | None
    recorded_base: str | None
    recorded_revision: str | None
    recorded_resolved: str | None  # the local folder the recorded base resolves to
    recorded_error: str | None
    loaded_base: str | None
    loaded_source: str | None  # adapter_config.json | --base | recipe
    loaded_error: str | None = None  # the base to load (an override) could not be found
    checked_modules: int = 0
    shapes_not_checked: str | None = None  # why the base skeleton could not be built
    shape_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    base_differences: dict[str, dict[str, int]] | None = None  # recorded vs loaded, per component
    chain: list[ChainNode] = dataclasses.field(default_factory=list)
    edges: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)

    @property
    def mismatched_base(self) -> bool:
        return bool(self.recorded_resolved and self.loaded_base
                    and Path(self.recorded_resolved).resolve() != Path(self.loaded_base).resolve())

    @property
    def same_weights(self) -> bool:
        """Two paths, one model: every tensor identical in sampled bytes, none only on one side."""
        diff = self.base_differences
        return bool(diff) and all(r["different"] == r["only_in_one"] == 0 for r in diff.values())

    @property
    def recorded_offline_hub_id(self) -> bool:
        from workbench.model.target import HUB_ID

        return bool(self.recorded_base and HUB_ID.match(self.recorded_base) and not Path(self.recorded_base).exists())

    def findings(self) -> list[Finding]:
        evidence = {"adapter": self.adapter, "recorded_base": self.recorded_base,
                    "recorded_revision": self.recorded_revision, "recorded_resolved": self.recorded_resolved,
                    "loaded_base": self.loaded_base, "loaded_source": self.loaded_source,
                    "target_modules_checked": self.checked_modules, "shapes_not_checked": self.shapes_not_checked,
                    "shape_mismatches": self.shape_mismatches[:20],
                    "base_differences": self.base_differences,
                    "chain": [dataclasses.asdict(n) for n in self.chain]}
        if self.adapter is None:
            return [Finding("adapter.base_model", "skip", "No adapter: nothing to match to a base",
                            "The checkpoint is a full model.", evidence)]
        if self.loaded_error:
            return [Finding("adapter.base_model", "error", "The base to load the adapter on cannot be found",
                            self.loaded_error, evidence, "Fix the base path (the recipe's base: or --base).")]
        if self.recorded_error and not (self.loaded_base and self.recorded_offline_hub_id):
            return [Finding("adapter.base_model", "error", f"The base recorded by the adapter cannot be found: "
                            f"{self.recorded_base}", self.recorded_error, evidence,
                            "Restore the recorded base at that path, or pass the right base explicitly "
                            "(--base / the recipe's base) — and check it is the model the adapter was trained on.")]
        if self.recorded_error and self.loaded_base and self.recorded_offline_hub_id:
            return [Finding("adapter.base_model", "warn", f"Recorded base {self.recorded_base} is not available "
                            "offline: cannot verify the base", f"{Path(self.adapter).name} records the hub id "
                            f"{self.recorded_base}, which is not in the local Hugging Face cache; "
                            f"{self.loaded_base} was loaded (from {self.loaded_source}). "
                            f"{self.checked_modules} LoRA tensors fit its modules' shapes.", evidence,
                            f"Make sure {self.loaded_base} is a copy of {self.recorded_base}"
                            + (f" at revision {self.recorded_revision}" if self.recorded_revision else "")
                            + " (compare config.json and a few weights), or put it in the HF cache.")]
        fix = (f"Load the adapter on {self.recorded_resolved} (what adapter_config.json records): drop the override, "
               "or fix the recipe's base.")
        if self.mismatched_base and self.same_weights:
            return [Finding("adapter.base_model", "info", "The loaded base is a copy of the recorded one",
                            f"Recorded {self.recorded_base}, loaded {self.loaded_base}: other paths, identical "
                            f"weights (sampled bytes of every tensor); {self.checked_modules} LoRA tensors fit.",
                            evidence)]
        if self.mismatched_base:
            diff = f" The two bases {describe_differences(self.base_differences)}." if self.base_differences else ""
            return [Finding("adapter.base_model", "fail",
                            f"Adapter evaluated on the wrong base: loaded {self.loaded_base}, trained on "
                            f"{self.recorded_base}",
                            f"{Path(self.adapter).name} records base {self.recorded_base}"
                            + (f" (revision {self.recorded_revision})" if self.recorded_revision else "")
                            + f" but {self.loaded_base} was loaded (from {self.loaded_source}). PEFT does not check "
                            f"this: the model runs and scores lower.{diff}", evidence, fix)]
        if self.shape_mismatches:
            return [Finding("adapter.base_model", "fail",
                            f"{len(self.shape_mismatches)} adapter tensor(s) do not fit the base's modules",
                            "; ".join(m["problem"] for m in self.shape_mismatches[:5]), evidence,
                            "The adapter was trained on another architecture or size: load it on the base recorded "
                            "in adapter_config.json.")]
        return [Finding("adapter.base_model", "pass", f"Adapter on the base it was trained on: "
                        f"{Path(self.loaded_base).name}",
                        f"Loaded base = recorded base ({self.recorded_base}); {self.checked_modules} LoRA tensors "
                        "match their base modules' shapes.", evidence)]

    def chain_text(self) -> str:
        """The chain in words: `a ⇢ b` inferred, `a → b` recorded, `a ⇒ b (wrong base)` loaded instead."""
        arrows = {"reference": " ⇢ ", "base": " → ", "loaded": " ⇒ "}
        parts = [f"{self.chain[a].label}{arrows.get(self.chain[a].kind, ' → ')}{self.chain[b].label} [{label}]"
                 for a, b, label in self.edges]
        return "; ".join(parts)

    def details(self):
        from workbench.display.nodes import Display, Figure, Paragraph

        # the drawing's text alternative is the paragraph before it, so text shows the chain once
        return Display(Paragraph(f"Lineage: {self.chain_text()}"),
                       Figure(lineage_svg(self.chain, self.edges), alt=""),
                       _differences_table(self.base_differences) if self.base_differences else None)


def _differences_table(diff: dict[str, dict[str, int]]):
    from workbench.display.nodes import Display, Paragraph, Table

    rows = [[c, r["identical"], r["different"], r["only_in_one"]] for c, r in sorted(diff.items())]
    return Display(Paragraph("Recorded base against loaded base, per component (sampled bytes of every tensor):"),
                   Table(["component", "identical", "different", "only in one"], rows))


COLOURS = {"reference": "#eceff1", "base": "#e3f2fd", "adapter": "#e8f5e9", "loaded": "#ffebee"}


def lineage_svg(nodes: list[ChainNode], edges: list[tuple[int, int, str]]) -> str:
    """A left-to-right chain of boxes with labelled arrows; a 'loaded' node (the wrong base) sits below, in red."""
    from workbench.display.findings_view import esc

    if not nodes:
        return ""
    width, height, gap = 190, 44, 200
    top = [i for i, n in enumerate(nodes) if n.kind != "loaded"]
    pos: dict[int, tuple[int, int]] = {i: (10 + k * (width + gap), 30) for k, i in enumerate(top)}
    for i, n in enumerate(nodes):
        if n.kind == "loaded":
            pos[i] = (10 + max(0, len(top) - 2) * (width + gap), 30 + height + 60)
    svg_w = max(x for x, _ in pos.values()) + width + 10
    svg_h = max(y for _, y in pos.values()) + height + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{svg_w}" height="{svg_h}" font-family="sans-serif" '
             'font-size="12"><defs><marker id="wb-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>']
    for i, n in enumerate(nodes):
        x, y = pos[i]
        stroke = "#c62828" if n.kind == "loaded" else "#607d8b"
        parts.append(f'<rect x="{x}" y="{y}" width="{width}" height="{height}" rx="6" fill="{COLOURS[n.kind]}" '
                     f'stroke="{stroke}"/><text x="{x + 8}" y="{y + 18}" font-weight="bold">{esc(n.label[:26])}</text>'
                     f'<text x="{x + 8}" y="{y + 34}" fill="#555">{esc(n.kind)}</text>')
    for a, b, label in edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        dashed = ' stroke-dasharray="5,4"' if nodes[a].kind in ("reference", "loaded") else ""
        colour = "#c62828" if nodes[a].kind == "loaded" else "#555"
        if ya == yb:
            x1, y1, x2, y2 = xa + width, ya + height / 2, xb, yb + height / 2
        else:
            x1, y1, x2, y2 = xa + width / 2, ya, xb + width / 2, yb + height
        parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}"{dashed} '
                     'marker-end="url(#wb-arrow)"/>')
        lx, ly = (x1 + x2) / 2, (min(y1, y2) - 6 if ya == yb else (y1 + y2) / 2 + 4)
        anchor = "middle" if ya == yb else "start"
        parts.append(f'<text x="{lx + (0 if ya == yb else 8)}" y="{ly}" text-anchor="{anchor}" fill="{colour}" '
                     f'font-size="10">{esc(label[:38])}</text>')
    return "<div>" + "".join(parts) + "</svg></div>"


def adapter_lineage(adapter_dir: Path | None, loaded_base: Path | None, loaded_source: str | None,
                    reference: Path | None = None, overrides: dict | None = None,
                    loaded_error: str | None = None, trust_remote_code: bool = False) -> LineageResult:
    """Compare an adapter's recorded base with the base loaded for it (reference: the recipes' original base)."""
    from workbench.model.loading import auto_config, meta_model
    from workbench.model.target import resolve_local

    if adapter_dir is None:
        return LineageResult(None, None, None, None, None, str(loaded_base) if loaded_base else None, None)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    recorded, revision = config.get("base_model_name_or_path"), config.get("revision")
    report = LineageResult(str(adapter_dir), recorded, revision, None, None,
                           str(loaded_base) if loaded_base else None, loaded_source, loaded_error)
    try:
        if not recorded:
            raise UsageError(f"{adapter_dir}/adapter_config.json records no base_model_name_or_path")
        report.recorded_resolved = str(resolve_local(recorded, what="the recorded base", relative_to=adapter_dir))
    except UsageError as exc:
        report.recorded_error = str(exc)
    classify = map_key = None
    if loaded_base is not None:
        try:
            skeleton, _ = meta_model(auto_config(loaded_base, trust_remote_code=trust_remote_code))
        except Exception as exc:  # noqa: BLE001 - the verdict on paths stands; shapes are then not checked
            report.shapes_not_checked = f"{type(exc).__name__}: {exc}"
        else:
            map_key, _ = checkpoint_key_mapper(skeleton)
            report.checked_modules, report.shape_mismatches = adapter_shape_mismatches(
                inspect_checkpoint(adapter_dir), skeleton, map_key)
            classify = ComponentClassifier.from_model(skeleton, overrides).component_of
            if report.mismatched_base:
                report.base_differences = component_differences(Path(report.recorded_resolved), loaded_base,
                                                                classify, map_key)
    if reference is not None:
        try:
            reference = resolve_local(str(reference), what="the reference base")
        except UsageError:
            reference = None  # no edge rather than a wrong one
    _chain(report, adapter_dir, reference, classify, map_key)
    return report


def _chain(report: LineageResult, adapter_dir: Path, reference: Path | None, classify, map_key) -> None:
    nodes, edges = report.chain, report.edges
    recorded = Path(report.recorded_resolved) if report.recorded_resolved else None
    if reference is not None and recorded is not None and reference.resolve() != recorded.resolve() and classify:
        nodes.append(ChainNode(reference.name, "reference", str(reference)))
        diff = component_differences(reference, recorded, classify, map_key)
        label = ("not compared (no safetensors)" if not diff else
                 "derived? " + describe_differences(diff).replace("differ in ", "changed: "))
        edges.append((0, 1, label))
    nodes.append(ChainNode(recorded.name if recorded else str(report.recorded_base), "base",
                           str(recorded or report.recorded_base)))
    nodes.append(ChainNode(adapter_dir.name, "adapter", str(adapter_dir)))
    edges.append((len(nodes) - 2, len(nodes) - 1, "adapter_config.json"))
    if report.mismatched_base:
        nodes.append(ChainNode(Path(report.loaded_base).name + " (loaded)", "loaded", report.loaded_base))
        edges.append((len(nodes) - 1, len(nodes) - 2, f"loaded from {report.loaded_source}"))


def adapter_lineage_probe(target, reference: str | None = None) -> LineageResult:
    """The target's adapter against the base it was loaded on; `reference` (e.g. the original base of a recipe
    list, or the parameters' `compare` entry) completes the chain."""
    from workbench.model.components import component_overrides

    ref = Path(reference) if reference else None
    return adapter_lineage(target.adapter_dir, target.model_dir if target.adapter_dir else None,
                           target.base_source, ref, component_overrides(target))
