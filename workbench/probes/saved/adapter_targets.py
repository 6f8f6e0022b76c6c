"""`adapter.targets`: what the adapter's target_modules reaches on the base, by PEFT's own matching.

PEFT decides which modules an adapter wraps with `check_target_module_exists` (a list matches by name suffix, a
string is a full regex, "all-linear" expands to every Linear but the output head). This probe asks PEFT the same
question of every module of a meta-device skeleton of the base (no weight read) and reports:

- the modules matched, per component (vision / language / projector / head / other), and their types;
- a pattern that matches nothing (PEFT refuses to build it: "Target modules ... not found in the base model");
- modules the adapter's saved weights name that the base lacks, or whose LoRA shapes do not fit (load drops or
  refuses them);
- a reach the user may not intend: a name list or "all-linear" that also lands on the vision tower (CLIP and
  SigLIP towers use q_proj/v_proj too: LLaVA #1380; all-linear reaching vision layers: ms-swift #2640), a
  convolution, or the output head;
- modules_to_save, and whether each exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.probes.saved.files import SavedFiles, adapter_module

CHECK = "adapter.targets"
SUPPORTED = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "Conv1D", "MultiheadAttention")


@dataclasses.dataclass(repr=False)
class AdapterTargetsResult(ProbeResult):
    adapter: str | None
    skipped: str | None = None
    error: str | None = None  # the base skeleton or the config could not be built
    peft_type: str | None = None
    target_modules: Any = None
    form: str = ""  # "list" | "regex" | "all-linear" | "none"
    matched: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # component -> module paths
    matched_types: dict[str, str] = dataclasses.field(default_factory=dict)  # module path -> class name
    missing_in_base: list[str] = dataclasses.field(default_factory=list)  # adapter weights' modules the base lacks
    shape_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unsupported: list[str] = dataclasses.field(default_factory=list)  # matched modules PEFT cannot wrap
    modules_to_save: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # name -> matched modules
    saved_but_not_matched: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.matched.values())

    def counts(self) -> dict[str, int]:
        return {c: len(v) for c, v in self.matched.items()}

    def unintended(self) -> list[str]:
        out = []
        comps = set(self.matched)
        if "vision" in comps and self.form in ("list", "all-linear") and comps - {"vision"}:
            names = sorted({m.rsplit(".", 1)[-1] for m in self.matched["vision"]})
            out.append(f"the {self.form} target_modules also matches {len(self.matched['vision'])} vision-tower "
                       f"module(s) ({', '.join(names[:6])}): the tower shares these names with the language model")
        convs = [m for m, t in self.matched_types.items() if t.startswith("Conv") and t != "Conv1D"]
        if convs:
            out.append(f"{len(convs)} convolution(s) matched ({', '.join(convs[:3])}): the patch embedding is rarely "
                       "meant to be adapted")
        if self.matched.get("head"):
            out.append(f"the output head is matched ({', '.join(self.matched['head'][:2])}): LoRA on lm_head "
                       "(all-linear leaves it out on purpose)")
        return out

    def findings(self) -> list[Finding]:
        evidence = {"adapter": self.adapter, "peft_type": self.peft_type, "target_modules": self.target_modules,
                    "form": self.form, "matched_per_component": self.counts(),
                    "matched_sample": {c: v[:5] for c, v in self.matched.items()},
                    "missing_in_base": self.missing_in_base[:20], "shape_mismatches": self.shape_mismatches[:10],
                    "unsupported": self.unsupported[:10], "modules_to_save": self.modules_to_save,
                    "saved_but_not_matched": self.saved_but_not_matched[:20]}
        if self.skipped:
            return [Finding(CHECK, "skip", "No adapter: nothing targets the base", self.skipped, evidence)]
        if self.error:
            return [Finding(CHECK, "error", "Could not match the adapter's targets on the base", self.error,
                            evidence, "Read the error: the base's config.json must build with this transformers "
                            "(or pass --trust-remote-code), and adapter_config.json must be PEFT's.")]
        problems = []
        if self.total == 0 and self.form != "none":
            problems.append(f"target_modules {self.target_modules!r} matches no module of the base (PEFT raises "
                            "\"Target modules ... not found in the base model\")")
        if self.missing_in_base:
            problems.append(f"the adapter's weights name {len(self.missing_in_base)} module(s) the base lacks "
                            f"({', '.join(self.missing_in_base[:3])}): loading drops them")
        if self.shape_mismatches:
            problems.append(f"{len(self.shape_mismatches)} LoRA tensor(s) do not fit the base's modules ("
                            + "; ".join(m["problem"] for m in self.shape_mismatches[:2]) + ")")
        if self.unsupported:
            problems.append(f"target_modules matches module(s) PEFT cannot wrap: {', '.join(self.unsupported[:3])}")
        missing_mts = [name for name, found in self.modules_to_save.items() if not found]
        if missing_mts:
            problems.append(f"modules_to_save names {', '.join(missing_mts)}, which the base lacks")
        counts = ", ".join(f"{c} {n}" for c, n in self.counts().items()) or "none"
        if problems:
            return [Finding(CHECK, "fail", f"The adapter cannot apply as saved: {problems[0]}",
                            "; ".join(problems) + f". Matched per component: {counts}.", evidence,
                            "Load the adapter on the base it was trained on (adapter_config.json's "
                            "base_model_name_or_path), or fix target_modules to names that exist, e.g. "
                            "`LoraConfig(target_modules=r'.*language_model.*\\.(q_proj|v_proj)')`.")]
        unintended = self.unintended()
        if unintended:
            return [Finding(CHECK, "warn", f"target_modules reaches further than it may mean to: {unintended[0]}",
                            "; ".join(unintended) + f". Matched per component: {counts}.", evidence,
                            "Anchor the pattern to the part you mean to train, e.g. `LoraConfig(target_modules="
                            "r'.*language_model.*\\.(q_proj|k_proj|v_proj|o_proj)')`, or keep the list and add "
                            "`exclude_modules=r'.*visual.*'`.")]
        mts = (f"; modules_to_save: {', '.join(self.modules_to_save)}" if self.modules_to_save else "")
        return [Finding(CHECK, "info", f"target_modules matches {self.total} module(s): {counts}",
                        f"{self.form} target_modules {self.target_modules!r}, matched by PEFT's own rule on a "
                        f"meta-device skeleton of the base{mts}.", evidence)]

    def details(self):
        from workbench.display.nodes import Display, Table

        def names(modules: list[str]) -> str:
            return ", ".join(sorted({m.rsplit(".", 1)[-1] for m in modules}))

        rows = [[c, len(v), names(v)] for c, v in self.matched.items()]
        return Display(Table(["component", "modules matched", "names"], rows) if rows else None)


def component_of(classifier, name: str) -> str:
    """The classifier's component; modules between the towers (projector, merger, connector) are "projector"."""
    component = classifier.component_of(name)
    if component == "other" and any(k in name for k in ("projector", "merger", "connector", "mm_proj")):
        return "projector"
    return component


def _form(target_modules: Any) -> str:
    if target_modules is None:
        return "none"
    if isinstance(target_modules, str):
        return "all-linear" if target_modules.lower() == "all-linear" else "regex"
    return "list"


def adapter_targets_probe(files: SavedFiles) -> AdapterTargetsResult:
    """target_modules (list, regex or all-linear) matched on a meta skeleton of the base, by PEFT's rule."""
    if files.adapter_dir is None:
        return AdapterTargetsResult(None, skipped="The checkpoint is a full model.")
    result = AdapterTargetsResult(str(files.adapter_dir))
    raw = files.adapter_config or {}
    result.peft_type, result.target_modules = raw.get("peft_type"), raw.get("target_modules")
    result.form = _form(result.target_modules)
    skeleton = files.skeleton
    if skeleton is None:
        result.error = f"the base's skeleton could not be built: {files.skeleton_error}"
        return result
    model, map_key, classifier = skeleton
    try:
        from peft import PeftConfig
        from peft.tuners.tuners_utils import (
            _ExcludedModule,
            _maybe_include_all_linear_layers,
            check_target_module_exists,
        )

        config = PeftConfig.from_pretrained(str(files.adapter_dir))
    except Exception as exc:  # noqa: BLE001 - a config PEFT cannot read is this check's error
        result.error = f"PEFT cannot read {files.adapter_dir}/adapter_config.json: {type(exc).__name__}: {exc}"
        return result
    if result.form == "all-linear":
        config = _maybe_include_all_linear_layers(config, model)
    modules = dict(model.named_modules())
    if getattr(config, "target_modules", None) is not None:
        for name, module in modules.items():
            if not name:
                continue
            hit = check_target_module_exists(config, name)
            if hit and not isinstance(hit, _ExcludedModule):
                result.matched.setdefault(component_of(classifier, name), []).append(name)
                kind = type(module).__name__
                result.matched_types[name] = kind
                if kind not in SUPPORTED and not list(module.children()):
                    result.unsupported.append(f"{name} ({kind})")
    for pattern in getattr(config, "modules_to_save", None) or []:
        result.modules_to_save[pattern] = [n for n in modules if n and (n == pattern or n.endswith("." + pattern))]
    # what the saved weights name
    from workbench.probes.evaluation.lineage import adapter_shape_mismatches

    named = set()
    for t in files.adapter_tensors:
        parsed = adapter_module(t.name)
        module = parsed[0] if parsed else None
        if module is None:
            continue
        path = map_key(module + ".weight").removesuffix(".weight")
        if path not in modules:
            result.missing_in_base.append(path)
        named.add(path)
    result.missing_in_base = sorted(set(result.missing_in_base))
    if files.adapter is not None:
        _, result.shape_mismatches = adapter_shape_mismatches(files.adapter, model, map_key)
        result.shape_mismatches = [m for m in result.shape_mismatches if "has no module" not in m["problem"]]
    matched = {m for v in result.matched.values() for m in v}
    result.saved_but_not_matched = sorted(named - matched - set(result.missing_in_base))
    return result
