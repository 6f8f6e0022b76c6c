"""Recipes to evaluate side by side: a YAML list (`parameters/recipes.yaml`), or the CLI's CKPT/ADAPTER/BASE.

    base: ../.cache/demo/qwen2vl-base          # the reference row: the original base, evaluated as is
    dataset: ../.cache/demo/recipes/grounding-eval   # data.jsonl + images (workbench.tasks.grounding's format)
    max_samples: 32                            # optional; max_new_tokens (24) and batch_size (16) too
    recipes:
      - {name: r1-llm-only, path: ../.cache/demo/recipes/r1-llm-only}          # kind from the folder
      - {name: r3-two-stage, path: ../.cache/demo/recipes/r3-stage2, base: …}   # base: override (rarely right)

Paths are relative to the YAML file. A recipe is an adapter when its folder holds adapter_config.json (its base
then comes from there unless `base:` overrides it), else a full checkpoint. A file that cannot be read at all is
a usage error (exit 2); a recipe whose path or base is missing is kept, with its reason, as an error row.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.errors import UsageError

FILE_KEYS = {"base", "dataset", "max_samples", "max_new_tokens", "batch_size", "recipes"}
RECIPE_KEYS = {"name", "path", "base", "kind"}


@dataclasses.dataclass
class Recipe:
    name: str
    path: str
    kind: str = "auto"  # auto | full | adapter | base (the reference row)
    base: str | None = None  # override of the adapter's recorded base
    relative_to: str | None = None  # the recipes file's folder

    def folder(self) -> Path:
        """The recipe's folder; UsageError with the reason when it does not exist."""
        from workbench.model.target import resolve_local

        return resolve_local(self.path, what=f"recipe {self.name}: path",
                             relative_to=Path(self.relative_to) if self.relative_to else None)

    def kind_or_missing(self) -> str:
        try:
            return self.resolved_kind()
        except UsageError:
            return "missing"

    def resolved_kind(self) -> str:
        if self.kind != "auto":
            return self.kind
        return "adapter" if (self.folder() / "adapter_config.json").exists() else "full"


@dataclasses.dataclass(repr=False)
class RecipeList(ProbeResult):
    recipes: list[Recipe]
    reference: str | None  # the original base, evaluated as a reference row
    dataset: str | None
    max_samples: int | None = None
    max_new_tokens: int = 24
    source: str = "the command line"
    batch_size: int = 16  # samples generated together (a batch that fails is retried one sample at a time)

    def details(self):
        from workbench.display.nodes import Code, Display, Paragraph, Table

        rows = [[r.name, r.kind_or_missing(), Code(r.path), Code(r.base or "")] for r in self.recipes]
        return Display(Paragraph(f"{len(self.recipes)} recipe(s) from {self.source}; reference base: ",
                                 Code(self.reference or "none"), "; dataset: ", Code(self.dataset or "none"),
                                 f" (first {self.max_samples} rows)" if self.max_samples else ""),
                       Table(["recipe", "kind", "path", "base override"], rows))


def _absolute(ref: str | None, folder: Path) -> str | None:
    """A path relative to the recipes file's folder (as documented), else as given (absolute, or a hub id)."""
    if not ref:
        return None
    path = Path(ref).expanduser()
    if path.is_absolute():
        return str(path)
    from workbench.model.target import HUB_ID

    return ref if HUB_ID.match(ref) and not (folder / path).exists() else str(folder / path)


def read_recipes(path: str | Path) -> RecipeList:
    """Parse a recipes YAML file (see the module docstring)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"recipes file {path} does not exist") from None
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"recipes file {path} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("recipes"), list) or not data["recipes"]:
        raise UsageError(f"recipes file {path}: expected a mapping with a non-empty `recipes:` list")
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise UsageError(f"recipes file {path}: unknown key(s) {', '.join(sorted(unknown))}; use "
                         f"{', '.join(sorted(FILE_KEYS))}")
    folder = path.resolve().parent
    recipes = []
    for i, item in enumerate(data["recipes"], 1):
        if not isinstance(item, dict) or not item.get("path"):
            raise UsageError(f"recipes file {path}: recipe {i} needs at least `path:` (and usually `name:`)")
        if set(item) - RECIPE_KEYS:
            raise UsageError(f"recipes file {path}: recipe {i} has unknown key(s) "
                             f"{', '.join(sorted(set(item) - RECIPE_KEYS))}; use {', '.join(sorted(RECIPE_KEYS))}")
        kind = item.get("kind", "auto")
        if kind not in ("auto", "full", "adapter"):
            raise UsageError(f"recipes file {path}: recipe {i} kind {kind!r}: use full or adapter (or leave it out)")
        recipes.append(Recipe(str(item.get("name") or Path(item["path"]).name),
                              _absolute(str(item["path"]), folder), kind,
                              _absolute(item.get("base"), folder), str(folder)))
    names = [r.name for r in recipes]
    if len(set(names)) != len(names):
        raise UsageError(f"recipes file {path}: recipe names must differ (give each a name:); got {names}")
    for key in ("max_samples", "max_new_tokens", "batch_size"):
        if key in data and (not isinstance(data[key], int) or data[key] < 1):
            raise UsageError(f"recipes file {path}: {key} must be a whole number ≥ 1")
    return RecipeList(recipes, _absolute(data.get("base"), folder), _absolute(data.get("dataset"), folder),
                      data.get("max_samples"), data.get("max_new_tokens", 24), str(path), data.get("batch_size", 16))


def recipes_for(target, recipes_path: str | None = None) -> RecipeList:
    """The recipes file when given ("demo" or "demo:ROOT": the bundled demo's, trained on first use), else the target
    as one recipe with its base as the reference row. Dataset and sample count from the parameters (`eval_dataset`,
    `eval_samples`) override the file's."""
    if recipes_path and recipes_path.split(":", 1)[0] == "demo":
        from workbench.demo.build import build_demo_recipes

        root = recipes_path.partition(":")[2] or None
        recipes_path = str(build_demo_recipes(root).recipes_file)
    if recipes_path:
        listed = read_recipes(recipes_path)
    else:
        adapter = target.adapter_dir
        recipe = Recipe(target.name, str(adapter or target.model_dir), "adapter" if adapter else "full",
                        target.base_arg and str(target.model_dir))
        listed = RecipeList([recipe], str(target.model_dir) if adapter else None, None)
    params: dict[str, Any] = target.params or {}
    if params.get("eval_dataset"):
        listed.dataset = params["eval_dataset"]
    if params.get("eval_samples"):
        listed.max_samples = params["eval_samples"]
    return listed
