"""Notebook 05: evaluate recipes side by side without being fooled (`eval.metrics`, `eval.memory`, and per recipe
`adapter.base_model` and `placement.offload`).

Each recipe is loaded alone: memory is freed before it (gc, and on CUDA `empty_cache` + `synchronize`), its adapter
is matched to the base it was trained on (lineage), its placement is read before the adapter goes on, then it
generates an answer per sample (greedy, `batch_size` samples at a time), parsed and scored by the metric registry (`workbench.probes.evaluation.metrics`), and
teacher-forced loss / token accuracy are measured on the reference answers. Peak memory per recipe (CUDA max
allocated on a GPU, resident set on the CPU) and what was not returned after freeing are recorded. A recipe that
cannot be loaded is an error row with its reason; the others still evaluate. The metrics score generated answers
to an image and a question: a recipe whose head cannot give one (a classifier, a bare encoder, a text-only LM) is
loaded and measured but not scored, and `eval.metrics` says skip with that reason when no recipe can be scored.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.display.findings_view import figure
from workbench.display.nodes import Bold, Code, Details, Display, Heading, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.errors import UsageError
from workbench.findings import Finding, verdict_rank
from workbench.model.components import unwrap_model
from workbench.model.heads import DESCRIPTIONS, GENERATES, head_kind
from workbench.model.inputs import load_vlm_parts
from workbench.model.loading import load_pretrained, parse_dtype
from workbench.model.memory import free_memory
from workbench.model.shared import make_room_for_a_copy, shared_if_prepared
from workbench.model.target import resolve_local
from workbench.probes.evaluation.generation import evaluate_samples
from workbench.probes.evaluation.lineage import LineageResult, adapter_lineage
from workbench.probes.evaluation.metrics import TABLE_COLUMNS, summarize
from workbench.probes.evaluation.placement import PlacementResult, placement_of
from workbench.probes.evaluation.recipes import Recipe, RecipeList
from workbench.tasks.grounding import read_dataset

GROWTH_FLOOR = 64 * 1024**2  # memory not returned after a recipe is flagged above this (and half its model)
RANKING = ("mean_iou", "exact_match", "token_accuracy")  # the first metric with values ranks the recipes
SCORED_HEADS = frozenset({"image_text_to_text"})  # the evaluation set feeds an image and a question


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def in_use_bytes() -> int:
    """Memory held now: CUDA allocated on every GPU of the machine, else the resident set."""
    if torch.cuda.is_available():
        return sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))
    return rss_bytes()


def cuda_peak_bytes() -> int:
    """Sum of each GPU's peak since the last reset (an upper bound of the simultaneous peak across GPUs)."""
    return sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))


@dataclasses.dataclass
class RecipeOutcome:
    name: str
    kind: str
    path: str
    base: str | None = None
    records: list = dataclasses.field(default_factory=list)
    summary: dict[str, Any] | None = None
    lineage: LineageResult | None = None
    placement: PlacementResult | None = None
    memory: dict[str, int | float] = dataclasses.field(default_factory=dict)
    error: str | None = None
    head: str | None = None  # workbench.model.heads kind of the loaded model
    model_class: str | None = None
    unscorable: str | None = None  # why the metrics cannot score this head (it was loaded, not evaluated)


def _load(recipe: Recipe, reference: str | None, options: dict[str, Any], outcome: RecipeOutcome, shared=None):
    """(model, tokenizer, image_processor) for one recipe, filling the outcome's lineage and placement as they
    become known; raises UsageError with the reason. `shared`: the diagnosis' prepared model when this recipe is
    the target itself and nothing is generated: its placement is read there instead of loading it again."""
    folder = recipe.folder()
    kind = recipe.resolved_kind()
    outcome.kind, outcome.path = kind, str(folder)
    load = dict(quant=options.get("quant", "none"), dtype=parse_dtype(options.get("dtype")),
                device_map=options.get("device_map"), max_memory=options.get("max_memory"),
                trust_remote_code=options.get("trust_remote_code", False))
    if kind != "adapter":
        outcome.base = str(folder)
        model = shared if shared is not None else load_pretrained(folder, **load,
                                                                  why=f"eval.metrics: recipe {recipe.name}")
        outcome.placement = placement_of(model, recipe.name)
        return (model, *_processing(folder, None))
    recorded = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    base_ref, source = (recipe.base, "the recipe's base:") if recipe.base else (recorded, "adapter_config.json")
    if not base_ref:
        raise UsageError(f"{folder}/adapter_config.json records no base_model_name_or_path; give the recipe a base:")
    try:
        base_dir = resolve_local(base_ref, what=f"recipe {recipe.name}: base ({source})", relative_to=folder)
    except UsageError as exc:
        outcome.lineage = adapter_lineage(folder, None, source, Path(reference) if reference else None,
                                          loaded_error=str(exc),
                                          trust_remote_code=options.get("trust_remote_code", False))
        raise
    outcome.base = str(base_dir)
    outcome.lineage = adapter_lineage(folder, base_dir, source, Path(reference) if reference else None,
                                      trust_remote_code=options.get("trust_remote_code", False))
    if shared is not None:  # the set-up already put the adapter on; hf_device_map is the base's
        outcome.placement = placement_of(shared, recipe.name)
        return (shared, None, None)
    model = load_pretrained(base_dir, **load, why=f"eval.metrics: the base of recipe {recipe.name}")
    outcome.placement = placement_of(model, recipe.name)  # before the adapter: where the base landed
    from peft import PeftModel

    try:
        adapted = PeftModel.from_pretrained(model, str(folder))
    except Exception as exc:  # noqa: BLE001 - e.g. peft cannot map an adapter onto a disk-offloaded base
        del model
        raise UsageError(f"PEFT could not load the adapter onto {base_dir.name}: {type(exc).__name__}: {exc}") \
            from None
    return (adapted, *_processing(base_dir, folder))


def _processing(base_dir: Path, adapter_dir: Path | None):
    if adapter_dir is not None and (adapter_dir / "tokenizer_config.json").exists():
        tokenizer, _ = load_vlm_parts(adapter_dir)
        _, image_processor = load_vlm_parts(base_dir)
        return tokenizer, image_processor
    return load_vlm_parts(base_dir)


def evaluate_recipe(recipe: Recipe, rows: list, reference: str | None, options: dict[str, Any],
                    max_new_tokens: int, progress: Callable[[int, int, Any], Any] | None = None,
                    shared=None, batch_size: int = 16) -> RecipeOutcome:
    """Load, evaluate and free one recipe; every failure ends up in the outcome, never raised."""
    free_memory()
    before = in_use_bytes()
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)
    start = time.perf_counter()
    peak = [before]
    model = None
    outcome = RecipeOutcome(recipe.name, recipe.kind, recipe.path)
    try:
        model, tokenizer, image_processor = _load(recipe, reference, options, outcome, shared)
        peak.append(in_use_bytes())
        outcome.memory["model_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        outcome.head, outcome.model_class, outcome.unscorable = head_of(model)
        if outcome.unscorable:
            pass  # loaded and measured (eval.memory, placement.offload); the metrics do not apply to its head
        elif rows and (tokenizer is None or image_processor is None):
            outcome.error = f"{outcome.base} ships no tokenizer and image processor to build inputs with"
        elif rows:
            def sample_done(done, total, record):
                peak.append(in_use_bytes())
                if progress:
                    progress(done, total, record)
            outcome.records = evaluate_samples(model, tokenizer, image_processor, rows, max_new_tokens, sample_done,
                                               batch_size=batch_size)
            outcome.summary = summarize(outcome.records)
    except UsageError as exc:
        outcome.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - a recipe that crashes is that recipe's error row
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        del model
    peak_bytes = cuda_peak_bytes() if torch.cuda.is_available() else max(peak)
    free_memory()
    outcome.memory.update({"before": before, "peak": peak_bytes, "after_free": in_use_bytes(),
                           "seconds": round(time.perf_counter() - start, 2)})
    return outcome


def head_of(model) -> tuple[str, str, str | None]:
    """(head kind, model class, why the metrics cannot score it or None)."""
    head = head_kind(model)
    name = type(unwrap_model(model)[0]).__name__
    if head in SCORED_HEADS:
        return head, name, None
    what = f"this model is {name} — {DESCRIPTIONS.get(head, head)}"
    if head not in GENERATES:
        return head, name, f"generation metrics need a generative head; {what}, which generates no text"
    return head, name, (f"the evaluation set asks about an image (grounding: image + question → box), so its "
                        f"metrics need an image-text-to-text model; {what}, which takes no image")


@dataclasses.dataclass(repr=False)
class EvaluationResult(ProbeResult):
    outcomes: list[RecipeOutcome]
    reference_name: str | None
    dataset: str | None
    dataset_rows: int
    unreadable_rows: list[str]
    source: str
    memory_kind: str  # "CUDA allocated" | "RSS"

    # --- the table and the ranking --------------------------------------------------------------------------
    def table(self) -> list[dict[str, Any]]:
        rows = []
        for o in self.outcomes:
            row: dict[str, Any] = {"Model": o.name + (" (base)" if o.name == self.reference_name else "")}
            s = o.summary or {}
            row.update({label: s.get(name) for name, label in TABLE_COLUMNS.items()})
            row.update({"Exact": s.get("exact_match"), "Loss": s.get("loss"), "Tok acc": s.get("token_accuracy"),
                        "n": s.get("scored"), "failed": (s.get("errors", {}).get("exception", 0)
                                                          + s.get("errors", {}).get("parse", 0)) if s else None,
                        "error": o.error or ""})
            if o.unscorable:
                row["not scored"] = o.unscorable
            rows.append(row)
        return rows

    def ranking_metric(self) -> str | None:
        for name in RANKING:
            if any((o.summary or {}).get(name) is not None for o in self.outcomes):
                return name
        return None

    def best(self) -> tuple[RecipeOutcome | None, RecipeOutcome | None, str | None]:
        """(best recipe, the reference outcome, the metric ranked by)."""
        metric = self.ranking_metric()
        reference = next((o for o in self.outcomes if o.name == self.reference_name), None)
        scored = [o for o in self.outcomes if o is not reference and (o.summary or {}).get(metric) is not None]
        best = max(scored, key=lambda o: o.summary[metric]) if scored else None
        return best, reference, metric

    # --- findings ---------------------------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        return [self._metrics_finding(), self._memory_finding(), *self._per_recipe("adapter.base_model"),
                *self._per_recipe("placement.offload")]

    def _metrics_finding(self) -> Finding:
        evidence = {"dataset": self.dataset, "rows": self.dataset_rows, "unreadable_rows": self.unreadable_rows[:20],
                    "recipes_file": self.source, "table": self.table(),
                    "heads": {o.name: {"head": o.head, "model_class": o.model_class} for o in self.outcomes if o.head},
                    "failures": {o.name: [r.to_dict() for r in o.records if r.error][:10] for o in self.outcomes}}
        unscorable = [o for o in self.outcomes if o.unscorable]
        candidates = [o for o in self.outcomes if not o.unscorable]  # scorable, or not loaded (head unknown)
        not_scored = "".join(f" {o.name} is not scored: {o.unscorable}." for o in unscorable)
        if unscorable and not candidates:
            return Finding("eval.metrics", "skip", f"Not scored: {unscorable[0].unscorable}",
                           "; ".join(f"{o.name}: {o.unscorable}" for o in unscorable) + ". The recipes were loaded "
                           "and measured (eval.memory, placement.offload) but not scored: the metrics score "
                           "generated answers to an image and a question, which this head cannot give.", evidence)
        if not self.dataset:
            return Finding("eval.metrics", "skip", "No evaluation dataset",
                           "Recipes were loaded and checked (lineage, placement, memory) but not scored." + not_scored,
                           evidence, "Set eval_dataset in --params (a folder with data.jsonl and images), or "
                           "dataset: in the recipes file.")
        broken = [o for o in candidates if o.error]
        if len(broken) == len(candidates):
            return Finding("eval.metrics", "error", "No recipe could be evaluated",
                           "; ".join(f"{o.name}: {o.error}" for o in broken[:5]) + "." + not_scored, evidence,
                           "Fix the recipe paths / bases named above.")
        best, reference, metric = self.best()
        all_failed = [o for o in self.outcomes if o.summary and o.summary["scored"] and
                      o.summary["errors"]["exception"] == o.summary["scored"]]
        headline = "no recipe produced a score"
        if best is not None:
            value = best.summary[metric]
            headline = f"best: {best.name}, {metric} {value:.4f}"
            if reference is not None and (reference.summary or {}).get(metric) is not None:
                base = reference.summary[metric]
                gain = value - base
                headline += f", {gain:+.4f} over the base" + (f" ({gain / base:+.1%})" if base else "")
                evidence["gain_over_base"] = {"metric": metric, "best": value, "base": base, "absolute": gain}
            evidence["best"] = best.name
        if not any((o.summary or {}).get("scored") for o in self.outcomes):
            return Finding("eval.metrics", "error", "Nothing was scored: the dataset has no usable row",
                           f"{self.dataset_rows} row(s) in {self.dataset}; unreadable: "
                           + ("; ".join(self.unreadable_rows[:5]) or "none"), evidence,
                           "Fix the dataset (data.jsonl lines with image, question, answer, box) or point "
                           "eval_dataset at the right folder.")
        problems = [f"{o.name}: {o.error}" for o in broken] + [
            f"{o.name}: every sample raised ({o.records[0].error if o.records else ''})" for o in all_failed]
        if problems:
            return Finding("eval.metrics", "warn", f"{len(problems)} recipe(s) not evaluated properly; {headline}",
                           "; ".join(problems[:6]) + "." + not_scored, evidence,
                           "A 0 % row is a loading problem before it is a model problem: see adapter.base_model and "
                           "placement.offload for that recipe.")
        return Finding("eval.metrics", "pass", headline[0].upper() + headline[1:],
                       f"{len(candidates)} model(s) on {self.dataset_rows} sample(s) of {self.dataset}." + not_scored,
                       evidence)

    def _memory_finding(self) -> Finding:
        rows = [{"recipe": o.name, **o.memory} for o in self.outcomes]
        evidence = {"measured": self.memory_kind, "per_recipe": rows}
        # the first loaded recipe's leftover includes one-time costs (imports, allocator pools): growth counts from
        # there (on CUDA there are none: from before it)
        loaded = [o for o in self.outcomes if "model_bytes" in o.memory]
        first = (loaded[0].memory.get("before" if self.memory_kind.startswith("CUDA") else "after_free", 0)
                 if loaded else 0)
        grown = []
        for o in loaded[0 if self.memory_kind.startswith("CUDA") else 1:]:
            kept = o.memory.get("after_free", 0) - first
            if kept > max(GROWTH_FLOOR, 0.5 * o.memory.get("model_bytes", 0)):
                grown.append(f"{o.name} (+{kept / 2**20:.0f} MiB still held after freeing)")
        if grown:
            return Finding("eval.memory", "warn", "Memory grows from one recipe to the next",
                           ", ".join(grown) + f" ({self.memory_kind}). The next recipe loads with less room: "
                           "device_map='auto' then offloads silently.", evidence,
                           "Drop every reference to the previous model (outputs and trainers too) before loading "
                           "the next; gc.collect(); torch.cuda.empty_cache(); torch.cuda.synchronize().")
        peak = max((o.memory.get("peak", 0) for o in self.outcomes), default=0)
        return Finding("eval.memory", "pass", "Each recipe loaded alone and freed",
                       f"Peak {peak / 2**20:.0f} MiB ({self.memory_kind}); nothing held over between recipes.",
                       evidence)

    def _per_recipe(self, check: str) -> list[Finding]:
        """One finding per check across the recipes: the worst recipe's, naming every recipe's verdict."""
        per = []
        for o in self.outcomes:
            source = o.lineage if check == "adapter.base_model" else o.placement
            if source is not None:
                per.extend((o.name, f) for f in source.findings() if f.id == check)
        if check == "adapter.base_model":
            per = [(n, f) for n, f in per if f.verdict != "skip"]
        if not per:
            what = "no recipe is an adapter" if check == "adapter.base_model" else "no recipe could be loaded"
            return [Finding(check, "skip", f"Nothing to check: {what}", "", {})]
        per.sort(key=lambda item: verdict_rank(item[1].verdict))
        name, worst = per[0]
        summary = "; ".join(f"{n}: {f.verdict}" for n, f in per)
        return [Finding(check, worst.verdict, f"{name}: {worst.title}", f"{worst.detail} — all recipes: {summary}",
                        {"recipes": {n: f.evidence for n, f in per}}, worst.fix)]

    # --- display ------------------------------------------------------------------------------------------------
    def plot(self, rows: list[dict[str, Any]]):
        """The table's metric columns as grouped bars, one group per recipe row."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = list(TABLE_COLUMNS.values())
        fig, ax = plt.subplots(figsize=(8, 3.2))
        width = 0.8 / len(labels)
        for k, label in enumerate(labels):
            ax.bar([i + k * width for i in range(len(rows))], [r[label] or 0 for r in rows], width, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["Model"] for r in rows], fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8, ncols=4, loc="upper left")
        ax.set_title("Recipes on the evaluation set")
        fig.tight_layout()
        return fig

    def details(self):
        table = self.table()
        scored = [r for r in table if r["Mean IoU"] is not None]
        chart = (figure(lambda: self.plot(scored), "the recipes' metrics on the evaluation set, as bars")
                 if scored else None)
        best, reference, metric = self.best()
        best_line = None
        if best is not None:
            gain = ""
            if reference is not None and (reference.summary or {}).get(metric):
                base = reference.summary[metric]
                gain = f", {(best.summary[metric] - base) / base:+.1%} over the base"
            best_line = Paragraph(Bold(f"Best recipe: {best.name}"), f" ({metric} {best.summary[metric]:.4f}{gain})")
        failures = [(o.name, r) for o in self.outcomes for r in o.records if r.error][:30]
        failure_table = Details(f"Per-sample failures ({len(failures)})", Table(
            ["recipe", "sample", "kind", "error", "answer"],
            [[n, r.index, r.error_kind or "", (r.error or "")[:200], Code((r.prediction or "")[:80])]
             for n, r in failures])) if failures else None
        memory = [{"recipe": o.name, **{k: (f"{v / 2**20:.1f} MiB" if k != "seconds" else v)
                                        for k, v in o.memory.items()}} for o in self.outcomes]
        lineage = [Display(Heading(o.name), o.lineage.view()) for o in self.outcomes if o.lineage is not None]
        placement = [Display(Heading(o.name), o.placement.view()) for o in self.outcomes
                     if o.placement is not None and o.placement.device_map]
        return Display(best_line, Table.from_records(table), chart,
                       failure_table, Heading(f"Memory per recipe ({self.memory_kind})", level=3),
                       Table.from_records(memory),
                       *([Heading("Adapter lineage", level=3), *lineage] if lineage else []),
                       *([Heading("Placement", level=3), *placement] if placement else []))


def _progress_bar(total: int, name: str):
    """A tqdm bar in JupyterLab; in batch runs (WORKBENCH_BATCH=1, set by the report runner) one line per recipe."""
    if os.environ.get("WORKBENCH_BATCH"):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, leave=True)


def _shared_model_of(recipe: Recipe, target):
    """The diagnosis' prepared model when `recipe` is the target itself (same folder, no other base) and it is
    resident: nothing is generated without a dataset, so its placement can be read without a second load."""
    own = target.adapter_dir or target.model_dir
    if recipe.base or Path(recipe.path).resolve() != Path(own).resolve():
        return None
    prepared = shared_if_prepared(target)
    return prepared.model if prepared is not None else None


def evaluate_recipes(recipes: RecipeList, target) -> EvaluationResult:
    """Every recipe of the list, plus the reference base, one at a time with the target's load options."""
    rows, unreadable = [], []
    if recipes.dataset:
        rows = read_dataset(recipes.dataset)
        unreadable = [f"line {r.line}: {r.error}" for r in rows if r.error]
        if recipes.max_samples:
            rows = rows[: recipes.max_samples]
    listed = list(recipes.recipes)
    reference_name = None
    if recipes.reference:
        reference_name = Path(recipes.reference).name
        listed.insert(0, Recipe(reference_name, recipes.reference, "full"))
    options = dict(quant=target.quant, dtype=target.dtype, device_map=target.device_map,
                   max_memory=target.max_memory, trust_remote_code=target.trust_remote_code)
    if rows or any(_shared_model_of(r, target) is None for r in listed):
        make_room_for_a_copy(target)  # recipes load one by one: a big shared model is not kept beside them
    outcomes = []
    for recipe in listed:
        bar = _progress_bar(len(rows), recipe.name)
        outcome = evaluate_recipe(recipe, rows, recipes.reference, options, recipes.max_new_tokens,
                                  (lambda done, total, record, bar=bar: bar.update(1)) if bar else None,
                                  shared=None if rows else _shared_model_of(recipe, target),
                                  batch_size=recipes.batch_size)
        if bar:
            bar.close()
        else:
            score = (outcome.summary or {}).get("mean_iou")
            print(f"{recipe.name}: {len(outcome.records)} sample(s) in {outcome.memory.get('seconds', 0)} s"
                  + (f", mean IoU {score:.3f}" if score is not None else "")
                  + (f" — error: {outcome.error}" if outcome.error else ""), flush=True)
        outcomes.append(outcome)
    return EvaluationResult(outcomes, reference_name, recipes.dataset, len(rows), unreadable, recipes.source,
                            "CUDA allocated" if torch.cuda.is_available() else "RSS")
