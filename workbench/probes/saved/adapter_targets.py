"""`adapter.targets`: what the adapter's target_modules reaches on the base, by PEFT's own matching.

PEFT decides which modules an adapter wraps with `check_target_module_exists` (a list matches by name suffix, a
string is a full regex, "all-linear" expands to every Linear but the output head). This probe asks PEFT the same
question of every module of a meta-device skeleton of the base (no weight read) and reports:

- the modules matched, per component (vision / language / projector / head / other), and their types;
- a pattern that matches nothing (PEFT refuses to build it: "Target modules ... not found in the base model");
- list entries (or a regex's `(a|b|c)` alternatives) that match nothing while others do: PEFT builds the adapter
  from the rest without a word, e.g. q_proj/k_proj/v_proj/gate_proj/up_proj on Phi-3, whose projections are the
  fused qkv_proj and gate_up_proj, train only o_proj and down_proj (LLaMA-Factory #4020);
- modules the adapter's saved weights name that the base lacks, or whose LoRA shapes do not fit (load drops or
  refuses them);
- a reach the user may not intend: a name list or "all-linear" that also lands on the vision tower (CLIP and
  SigLIP towers use q_proj/v_proj too: LLaVA #1380; all-linear reaching vision layers: ms-swift #2640), a
  convolution, or the output head;
- modules_to_save, and whether each exists.

Every fix is built from the base's own structure: the leaf names of the modules PEFT can wrap, per component
(`adaptable`), and each component's module path (`prefixes`), never from another model's names.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.lora import adapter_module
from workbench.probes.saved.files import SavedFiles
from workbench.probes.saved.target_names import (
    ALTERNATION,
    anchored_regex,
    common_parts,
    is_counterpart,
    leaf,
    shares_role,
)

CHECK = "adapter.targets"
SUPPORTED = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "Conv1D", "MultiheadAttention")
LINEAR = ("Linear", "Conv1D")  # what a LoRA on the projections targets (all-linear's own set)
# a regex group of plain-name alternatives, `(q_proj|v_proj)` or `(?:0|2)`: each alternative is checked alone
CLASSIFIER_TASKS = ("SEQ_CLS", "TOKEN_CLS", "QUESTION_ANS")  # PEFT adds its classifier names to modules_to_save
CLASSIFIER_NAMES = ("classifier", "score", "qa_outputs")


@dataclasses.dataclass(repr=False)
class AdapterTargetsResult(ProbeResult):
    adapter: str | None
    skipped: str | None = None
    error: str | None = None  # the base skeleton or the config could not be built
    peft_type: str | None = None
    task_type: str | None = None
    target_modules: Any = None
    form: str = ""  # "list" | "regex" | "all-linear" | "none"
    base_model: str | None = None  # adapter_config.json's base_model_name_or_path
    base_dir: str | None = None  # the base this probe matched on
    matched: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # component -> module paths
    matched_types: dict[str, str] = dataclasses.field(default_factory=dict)  # module path -> class name
    unmatched: list[str] = dataclasses.field(default_factory=list)  # list entries / regex alternatives: no match
    counterparts: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # unmatched -> base names by role
    # unmatched entries whose role a matched name already trains (a list written for several architectures:
    # qkv_proj beside q_proj and v_proj on a Llama): harmless, said in the info
    covered: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    # unmatched entries the base has, left out by the adapter's own exclude_modules / layers_to_transform /
    # modules_to_save (PEFT's TOKEN_CLS all-linear lists `classifier` and excludes it): meant, said in the info
    excluded: list[str] = dataclasses.field(default_factory=list)
    adaptable: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # component -> {leaf: type}
    prefixes: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # component -> its module paths
    embeddings: dict[str, str | None] = dataclasses.field(default_factory=dict)  # input / output -> module path
    # stacked expert weights (3-D parameters such as `experts.gate_up_proj` of a fused MoE): no module to target,
    # PEFT reaches them with target_parameters
    expert_parameters: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # component -> names
    parameter_counterparts: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # unmatched -> names
    target_parameters: list[str] | None = None
    matched_parameters: list[str] = dataclasses.field(default_factory=list)
    missing_in_base: list[str] = dataclasses.field(default_factory=list)  # adapter weights' modules the base lacks
    shape_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unsupported: list[str] = dataclasses.field(default_factory=list)  # matched modules PEFT cannot wrap
    # matched Linear layers an nn.MultiheadAttention owns: it reads their weight itself, so their LoRA never runs
    inert: list[str] = dataclasses.field(default_factory=list)
    modules_to_save: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # name -> matched modules
    saved_but_not_matched: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.matched.values())

    def counts(self) -> dict[str, int]:
        return {c: len(v) for c, v in self.matched.items()}

    # -- what the base offers ---------------------------------------------------------------------------------
    def linear_names(self, components) -> list[str]:
        return sorted({n for c in components for n, t in self.adaptable.get(c, {}).items() if t in LINEAR})

    def adaptable_text(self) -> str:
        return "; ".join(f"{c}: " + ", ".join(f"{n} ({t})" if t not in LINEAR else n for n, t in sorted(names.items()))
                         for c, names in self.adaptable.items())

    def _vision_reach(self) -> bool:
        comps = set(self.matched)
        return "vision" in comps and self.form in ("list", "all-linear") and bool(comps - {"vision"})

    def _convs(self) -> list[str]:
        return [m for m, t in self.matched_types.items() if t.startswith("Conv") and t != "Conv1D"]

    def unintended(self) -> list[str]:
        out = []
        if self._vision_reach():
            names = sorted({leaf(m) for m in self.matched["vision"]})
            why = ("all-linear takes every Linear layer, the tower's too" if self.form == "all-linear"
                   else "the tower shares these names with the language model")
            out.append(f"the {self.form} target_modules also matches {len(self.matched['vision'])} vision-tower "
                       f"module(s) ({', '.join(names[:6])}): {why}")
        convs = self._convs()
        if convs:
            out.append(f"{len(convs)} convolution(s) matched ({', '.join(convs[:3])}): a vision tower's patch "
                       "embedding is rarely meant to be adapted")
        if self.matched.get("head"):
            heads = sorted({leaf(m) for m in self.matched["head"]})
            out.append(f"the output head is matched ({', '.join(self.matched['head'][:2])}): LoRA on "
                       f"{', '.join(heads)} (all-linear leaves the output head out on purpose)")
        if self.inert:
            out.append(f"{len(self.inert)} layer(s) inside an nn.MultiheadAttention matched "
                       f"({', '.join(self.inert[:2])}): it reads their weight directly "
                       "(F.multi_head_attention_forward), so their LoRA never runs")
        return out

    # -- fixes, from the base's own names ---------------------------------------------------------------------
    def suggested_names(self) -> list[str]:
        """The user's names as this base has them: each entry that exists, else its counterparts by role."""
        present = self._present()
        out = []
        for name in self._wanted():
            out += [name] if name in present or name not in self.unmatched else self.counterparts.get(name, [])
        return list(dict.fromkeys(out))

    def _wanted(self) -> list[str]:
        if self.form == "list":
            return sorted(str(t) for t in self.target_modules)
        if self.form == "regex":
            alternatives = [a for m in ALTERNATION.finditer(self.target_modules) for a in m.group(1).split("|")]
            if alternatives:
                return alternatives
            leaves = {n for names in self.adaptable.values() for n in names}
            return [w for w in re.findall(r"[A-Za-z_]\w*", self.target_modules) if w in leaves]
        return []

    def anchored(self, components) -> str | None:
        """A regex for PEFT restricted to the components' module paths and the leaf names matched there."""
        convs = set(self._convs())
        names = sorted({leaf(m) for c in components for m in self.matched.get(c, []) if m not in convs})
        prefixes = [p for c in components for p in self._reached_prefixes(c)]
        return anchored_regex(prefixes, names) if names else None

    def _reached_prefixes(self, component: str) -> list[str]:
        modules = self.matched.get(component, [])
        own = [p for p in self.prefixes.get(component, []) if any(m.startswith(p + ".") for m in modules)]
        if own:
            return own
        common = ".".join(common_parts([m.split(".")[:-1] for m in modules]))
        return [common] if common else []

    def _reach_fix(self) -> str:
        intended = [c for c in self.matched if c != "head" and not (c == "vision" and self._vision_reach())]
        regex = self.anchored(intended)
        parts = []
        if regex:
            parts.append(f"anchor target_modules to the {' and '.join(intended)} module path of this base: "
                         f"`LoraConfig(target_modules=r\"{regex}\")`")
        vision = anchored_regex(self.prefixes.get("vision", []), None) if self._vision_reach() else None
        if vision:
            parts.append(f"keep target_modules as saved and add `exclude_modules=r\"{vision}\"`")
        if self.matched.get("head") and self.form == "list":
            head = {leaf(m) for m in self.matched["head"]}
            parts.append("drop " + ", ".join(sorted(head)) + " from the list (train the head fully with "
                         "`modules_to_save` if you mean to)")
        text = ("To train only what you mean to, " + "; or ".join(parts) + "."
                if parts else "Narrow target_modules to the layers you mean to train.")
        if self.inert:
            owners = sorted({m.rsplit(".", 1)[0] for m in self.inert})
            text += (f" Leave the MultiheadAttention's own layers out (`exclude_modules={self.inert!r}`), or target "
                     f"the MultiheadAttention itself ({', '.join(owners)}), which PEFT's LoRA supports.")
        return text

    @property
    def missed(self) -> list[str]:
        """Unmatched entries no matched name stands in for: what the user meant to train and does not."""
        return [u for u in self.unmatched if u not in self.covered and u not in self.excluded]

    def _unmatched_fix(self) -> str:
        names = self.suggested_names()
        pool = self.linear_names(c for c in (self.matched or self.adaptable) if c != "head")
        params = sorted({p for u in self.missed for p in self.parameter_counterparts.get(u, [])}
                        | set(self.target_parameters or ()))
        extra = f", target_parameters={params!r}" if params else ""
        if self.form == "list":
            suggestion = f"`LoraConfig(target_modules={names!r}{extra})`" if names else None
        else:
            suggestion = (f"`LoraConfig(target_modules=r\"{self._narrowed_regex(names)}\"{extra})`" if names
                          else None)
        missing = [u for u in self.missed if not self.counterparts.get(u) and not self.parameter_counterparts.get(u)
                   and u not in self._present()]
        text = f"Name the modules this base has: {suggestion}" if suggestion else "Name modules this base has"
        if params:
            text += (f" (the experts hold {', '.join(params)} as parameters, not modules: target_parameters reaches "
                     "them, target_modules cannot)")
        if missing:
            text += (f" ({', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no counterpart by name; this "
                     f"base's linear layers are {', '.join(pool)}: add the ones you mean to train)")
        return text + (", or `target_modules=\"all-linear\"` (every linear layer but the output head" +
                       (", not the experts' parameters)." if params else ")."))

    def _narrowed_regex(self, names: list[str]) -> str:
        """The user's regex with each `(a|b)` group holding the names this base has."""
        pattern = self.target_modules

        def replace(m: re.Match) -> str:
            alts = m.group(1).split("|")
            kept = list(dict.fromkeys(n for a in alts for n in ([a] if a not in self.missed
                                                                 else self.counterparts.get(a, []))))
            return "(" + "|".join(kept) + ")" if kept else m.group(0)
        return ALTERNATION.sub(replace, pattern)

    def _present(self) -> set[str]:
        return {n for names in self.adaptable.values() for n in names}

    def _nothing_fix(self) -> str:
        names = self.suggested_names() or self.linear_names(c for c in self.adaptable if c not in ("head", "vision"))
        text = "; or, if this is the base you mean, name modules it has: "
        if "vision" in self.adaptable and "language" in self.prefixes:
            return text + f"`LoraConfig(target_modules=r\"{anchored_regex(self.prefixes['language'], names)}\")`"
        return text + f"`LoraConfig(target_modules={names!r})`"

    def _base_fix(self) -> str:
        recorded = f"adapter_config.json records base_model_name_or_path={self.base_model!r}" if self.base_model \
            else "adapter_config.json records no base_model_name_or_path"
        return f"Load the adapter on the base it was trained on ({recorded}; matched here on {self.base_dir})"

    def missing_modules_to_save(self) -> list[str]:
        """modules_to_save entries the base lacks, less PEFT's own: SEQ_CLS / TOKEN_CLS add both `classifier` and
        `score` (every model has one of them)."""
        missing = [name for name, found in self.modules_to_save.items() if not found]
        own = set(CLASSIFIER_NAMES) if self.task_type in CLASSIFIER_TASKS else set()
        if any(self.modules_to_save.get(n) for n in own):
            missing = [n for n in missing if n not in own]
        return missing

    def _modules_to_save_fix(self, missing: list[str]) -> str:
        have = [p for p in dict.fromkeys((self.embeddings.get("input"), self.embeddings.get("output"))) if p]
        return (f"Drop {', '.join(missing)} from modules_to_save, or name modules this base has"
                + (f" (its embeddings: `modules_to_save={[leaf(p) for p in have]!r}`, i.e. {', '.join(have)})"
                   if have else "") + ".")

    # -- findings ---------------------------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        evidence = {"adapter": self.adapter, "peft_type": self.peft_type, "target_modules": self.target_modules,
                    "form": self.form, "matched_per_component": self.counts(),
                    "matched_sample": {c: v[:5] for c, v in self.matched.items()},
                    "unmatched_entries": self.unmatched, "counterparts": self.counterparts,
                    "covered_by_matched": self.covered, "parameter_counterparts": self.parameter_counterparts,
                    "expert_parameters": self.expert_parameters, "target_parameters": self.target_parameters,
                    "matched_parameters": len(self.matched_parameters),
                    "adaptable_names": {c: sorted(v) for c, v in self.adaptable.items()},
                    "component_prefixes": self.prefixes,
                    "missing_in_base": self.missing_in_base[:20], "shape_mismatches": self.shape_mismatches[:10],
                    "unsupported": self.unsupported[:10], "modules_to_save": self.modules_to_save,
                    "saved_but_not_matched": self.saved_but_not_matched[:20]}
        if self.skipped:
            return [Finding(CHECK, "skip", "No adapter: nothing targets the base", self.skipped, evidence)]
        if self.error:
            return [Finding(CHECK, "error", "Could not match the adapter's targets on the base", self.error,
                            evidence, "Read the error: the base's config.json must build with this transformers "
                            "(or pass --trust-remote-code), and adapter_config.json must be PEFT's.")]
        counts = ", ".join(f"{c} {n}" for c, n in self.counts().items()) or "none"
        problems: list[tuple[str, str]] = []  # (what, its fix)
        nothing = self.total == 0 and self.form != "none"
        base_fix = self._base_fix() + (self._nothing_fix() if nothing else "") + "."  # another base's adapter?
        if nothing:
            problems.append((f"target_modules {_short(self.target_modules)} matches no module of the base (PEFT "
                             "raises \"Target modules ... not found in the base model\")", base_fix))
        if self.target_parameters and not self.matched_parameters:
            experts = sorted({p for v in self.expert_parameters.values() for p in v})
            problems.append((f"target_parameters {self.target_parameters!r} matches no parameter of the base (PEFT "
                             "raises \"target_parameters ... were set but no parameter was matched\")",
                             f"Name parameters this base has: `target_parameters={experts!r}`." if experts else
                             "Drop target_parameters: this base holds no stacked expert parameters."))
        if self.missing_in_base:
            problems.append((f"the adapter's weights name {len(self.missing_in_base)} module(s) the base lacks "
                             f"({', '.join(self.missing_in_base[:3])}): loading drops them", base_fix))
        if self.shape_mismatches:
            problems.append((f"{len(self.shape_mismatches)} LoRA tensor(s) do not fit the base's modules ("
                             + "; ".join(m["problem"] for m in self.shape_mismatches[:2]) + ")", base_fix))
        if self.unsupported:
            linear = self.linear_names(self.matched)
            problems.append((f"target_modules matches module(s) PEFT cannot wrap: {', '.join(self.unsupported[:3])}",
                             "Name the layers PEFT wraps (Linear, Conv, Embedding): "
                             f"`LoraConfig(target_modules={linear!r})`." if linear else
                             "Name the layers PEFT wraps (Linear, Conv, Embedding) in target_modules."))
        missing_mts = self.missing_modules_to_save()
        if problems:
            return [Finding(CHECK, "fail", f"The adapter cannot apply as saved: {problems[0][0]}",
                            "; ".join(p for p, _ in problems) + f". Matched per component: {counts}. Adaptable "
                            f"names of this base: {self.adaptable_text()}.", evidence,
                            " ".join(dict.fromkeys(f for _, f in problems)))]
        warnings: list[tuple[str, str, str]] = []  # (title, detail, fix)
        if self.missed:
            trained = sorted({leaf(m) for v in self.matched.values() for m in v})
            entries = "entries" if self.form == "list" else "regex alternatives"
            title = (f"target_modules {entries} {', '.join(self.missed)} match nothing on this base: only "
                     f"{', '.join(trained)} train{'s' if len(trained) == 1 else ''}")
            detail = ("PEFT builds the adapter from the entries that match and says nothing about the rest "
                      "(LLaMA-Factory #4020: Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj)")
            by_role = "; ".join(f"{u} → {', '.join(c)}" for u, c in self.counterparts.items() if c and u in self.missed)
            if by_role:
                detail += f". This base's modules for them: {by_role}"
            by_param = "; ".join(f"{u} → {', '.join(c)}" for u, c in self.parameter_counterparts.items()
                                 if c and u in self.missed)
            if by_param:
                detail += f". This base's expert parameters for them (fused experts, no module): {by_param}"
            warnings.append((title, f"{title}. {detail}", self._unmatched_fix()))
        if missing_mts:
            title = f"modules_to_save names {', '.join(missing_mts)}, which the base lacks"
            warnings.append((title, f"{title}: PEFT skips them without a word, so they are neither trained nor saved",
                             self._modules_to_save_fix(missing_mts)))
        unintended = self.unintended()
        if unintended:
            warnings.append((f"target_modules reaches further than it may mean to: {unintended[0]}",
                             "; ".join(unintended), self._reach_fix()))
        if warnings:
            return [Finding(CHECK, "warn", warnings[0][0],
                            ". ".join(d for _, d, _ in warnings) + f". Matched per component: {counts}. Adaptable "
                            f"names of this base: {self.adaptable_text()}.", evidence,
                            " ".join(f for _, _, f in warnings))]
        mts = (f"; modules_to_save: {', '.join(self.modules_to_save)}" if self.modules_to_save else "")
        if self.target_parameters:
            mts += (f"; target_parameters {self.target_parameters!r}: {len(self.matched_parameters)} parameter(s) "
                    "matched")
        covered = "".join(f"; {u} matches nothing here, and its role is trained under {', '.join(c)} (a list "
                          "written for several architectures)" for u, c in self.covered.items())
        if self.excluded:
            covered += (f"; {', '.join(self.excluded)} exist{'s' if len(self.excluded) == 1 else ''} here and "
                        "exclude_modules / layers_to_transform / modules_to_save leave it out, as configured")
        return [Finding(CHECK, "info", f"target_modules matches {self.total} module(s): {counts}",
                        f"{self.form} target_modules {_short(self.target_modules)}, matched by PEFT's own rule on a "
                        f"meta-device skeleton of the base{mts}{covered}.", evidence)]

    def details(self):
        from workbench.display.nodes import Display, Table

        def names(modules: list[str]) -> str:
            return ", ".join(sorted({leaf(m) for m in modules}))

        rows = [[c, len(v), names(v)] for c, v in self.matched.items()]
        return Display(Table(["component", "modules matched", "names"], rows) if rows else None)


def _short(targets: Any) -> str:
    if isinstance(targets, (list, tuple, set)) and len(targets) > 4:
        return repr(sorted(targets)[:3])[:-1] + f", … ({len(targets)} entries)]"
    return repr(targets)


def component_of(classifier, name: str) -> str:
    """The classifier's component; modules between the towers (projector, merger, connector) are "projector"."""
    component = classifier.component_of(name)
    if component == "other" and any(k in name for k in ("projector", "merger", "connector", "mm_proj")):
        return "projector"
    return component


def _form(target_modules: Any) -> str:
    if not target_modules:  # None, or empty beside target_parameters
        return "none"
    if isinstance(target_modules, str):
        return "all-linear" if target_modules.lower() == "all-linear" else "regex"
    return "list"


def _peft_kind(module) -> str | None:
    """The kind of layer PEFT wraps that `module` is (its class or a base class named in SUPPORTED), else None."""
    return next((c.__name__ for c in type(module).__mro__ if c.__name__ in SUPPORTED), None)


def _base_structure(result: AdapterTargetsResult, modules: dict, classifier) -> None:
    for name, module in modules.items():
        kind = _peft_kind(module) if name else None
        if kind:
            result.adaptable.setdefault(component_of(classifier, name), {}).setdefault(leaf(name), kind)
        for param_name, param in (module.named_parameters(recurse=False) if name else ()):
            if param.ndim >= 3 and param_name not in ("weight", "bias"):
                experts = result.expert_parameters.setdefault(component_of(classifier, name), [])
                if f"{leaf(name)}.{param_name}" not in experts:
                    experts.append(f"{leaf(name)}.{param_name}")
    for prefix, component in sorted(classifier.prefixes, key=lambda pc: len(pc[0])):
        mine = result.prefixes.setdefault(component, [])
        if prefix and not any(prefix.startswith(p + ".") for p in mine):
            mine.append(prefix)
    result.prefixes = {c: p for c, p in result.prefixes.items() if p}


def _unmatched(result: AdapterTargetsResult, config, modules: dict) -> None:
    """List entries, or a regex's plain-name alternatives, that match nothing alone (by PEFT's rule, with the
    adapter's exclude_modules / layers_to_transform), and the base's names that likely stand for each."""
    from peft.tuners.tuners_utils import _ExcludedModule, check_target_module_exists

    if result.form == "list":
        trials = [(str(e), {e}) for e in sorted(result.target_modules)]
    elif result.form == "regex":
        pattern = result.target_modules
        trials = [(alt, pattern[:m.start()] + f"({alt})" + pattern[m.end():])
                  for m in ALTERNATION.finditer(pattern) for alt in m.group(1).split("|")]
    else:
        return
    def matches(entry: str, targets, unfiltered: bool = False) -> bool:
        alone = copy.copy(config)
        alone.target_modules = targets
        if unfiltered:  # without the adapter's own filters: does the entry name anything here at all?
            alone.exclude_modules = alone.layers_to_transform = alone.modules_to_save = None
        names = ([n for n in modules if n == entry or n.endswith("." + entry)] if result.form == "list"
                 else modules)  # a list entry matches by suffix: only those can match it
        return any(name and (hit := check_target_module_exists(alone, name))
                   and not isinstance(hit, _ExcludedModule) for name in names)

    if not result.total:  # nothing matches: every entry is unmatched
        result.unmatched = [entry for entry, _ in trials]
    elif len(trials) > 1:  # one entry alone matches, as the whole pattern did
        result.unmatched = [entry for entry, targets in trials if not matches(entry, targets)]
        result.excluded = [entry for entry, targets in trials
                           if entry in result.unmatched and matches(entry, targets, unfiltered=True)]
    pool = result.linear_names(c for c in (result.matched or result.adaptable) if c != "head")
    trained = sorted({leaf(m) for v in result.matched.values() for m in v})
    for entry in result.unmatched:
        name = entry.rsplit(".", 1)[-1]
        if entry in result.excluded:
            continue
        result.counterparts[entry] = [n for n in pool if is_counterpart(name, n)]
        experts = [p for c in (result.matched or result.adaptable) if c != "head"
                   for p in result.expert_parameters.get(c, [])]
        result.parameter_counterparts[entry] = [p for p in experts if p.rsplit(".", 1)[-1] == name
                                                or is_counterpart(name, p.rsplit(".", 1)[-1])]
        by = [t for t in trained if shares_role(name, t)]
        if by:
            result.covered[entry] = by


def adapter_targets_probe(files: SavedFiles) -> AdapterTargetsResult:
    """target_modules (list, regex or all-linear) matched on a meta skeleton of the base, by PEFT's rule."""
    if files.adapter_dir is None:
        return AdapterTargetsResult(None, skipped="The checkpoint is a full model.")
    result = AdapterTargetsResult(str(files.adapter_dir), base_dir=str(files.model_dir))
    raw = files.adapter_config or {}
    result.peft_type, result.target_modules = raw.get("peft_type"), raw.get("target_modules")
    result.task_type = raw.get("task_type")
    result.base_model = raw.get("base_model_name_or_path")
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
    modules = dict(model.named_modules())
    _base_structure(result, modules, classifier)
    result.embeddings = files.embedding_modules
    listed = copy.copy(config)  # before all-linear is expanded: the user's own entries
    if result.form == "all-linear":
        config = _maybe_include_all_linear_layers(config, model)
    if getattr(config, "target_modules", None) is not None:
        for name, module in modules.items():
            if not name:
                continue
            hit = check_target_module_exists(config, name)
            if hit and not isinstance(hit, _ExcludedModule):
                result.matched.setdefault(component_of(classifier, name), []).append(name)
                kind = type(module).__name__
                result.matched_types[name] = kind
                if _peft_kind(module) is None and not list(module.children()):
                    result.unsupported.append(f"{name} ({kind})")
                elif _peft_kind(modules.get(name.rpartition(".")[0])) == "MultiheadAttention":
                    result.inert.append(name)
        _unmatched(result, listed, modules)
    result.target_parameters = sorted(getattr(config, "target_parameters", None) or []) or None
    for name, param in model.named_parameters():
        if any(name == t or name.endswith("." + t) for t in result.target_parameters or ()):
            result.matched_parameters.append(name)
    for pattern in getattr(config, "modules_to_save", None) or []:
        result.modules_to_save[pattern] = [n for n in modules if n and (n == pattern or n.endswith("." + pattern))]
    # what the saved weights name
    from workbench.model.lora import adapter_shape_mismatches

    named = set()
    for t in files.adapter_tensors:
        parsed = adapter_module(t.name)
        module = parsed[0] if parsed else None
        if module is None:
            continue
        path = map_key(module + ".weight").removesuffix(".weight")
        while path.endswith(".base_layer"):  # PEFT nests a ParamWrapper per target parameter of one module
            path = path.removesuffix(".base_layer")
        if path not in modules:
            result.missing_in_base.append(path)
        named.add(path)
    result.missing_in_base = sorted(set(result.missing_in_base))
    if files.adapter is not None:
        _, result.shape_mismatches = adapter_shape_mismatches(files.adapter, model, map_key)
        result.shape_mismatches = [m for m in result.shape_mismatches if "has no module" not in m["problem"]]
    matched = {m for v in result.matched.values() for m in v}
    matched |= {p.rpartition(".")[0] for p in result.matched_parameters}
    result.saved_but_not_matched = sorted(named - matched - set(result.missing_in_base))
    return result
