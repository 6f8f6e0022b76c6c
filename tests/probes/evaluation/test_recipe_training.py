"""The recipes, trained for real once per session (conftest's `demo_recipes`: a short schedule in `make test`, the
write-up's full one under `make test-demo`), then evaluated the standard way: `from_pretrained(base)` +
`PeftModel.from_pretrained(model, adapter)`, greedy generation on the held-out split. The scores are read only from
the full schedule (the tests marked full_demo_training)."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from workbench.demo.training import RECIPES, TrainingSettings, build_recipes, train_recipe
from workbench.model.inputs import load_vlm_parts
from workbench.probes.evaluation.generation import evaluate_samples
from workbench.probes.evaluation.metrics import compute_metrics
from workbench.tasks.grounding import read_dataset

RECIPE_NAMES = ["r1-llm-only", "r2-vision-only", "r3-stage2", "r4-joint"]    # what the grounding table compares

pytestmark = pytest.mark.slow  # torchrun ranks / real training: not in the fast tier


def load_the_standard_way(folder: Path, base: Path | str | None = None):
    """A full checkpoint, or an adapter on the base its adapter_config.json records (or on `base`)."""
    from peft import PeftModel
    from transformers import Qwen2VLForConditionalGeneration

    config = folder / "adapter_config.json"
    if not config.exists():
        return Qwen2VLForConditionalGeneration.from_pretrained(str(folder))
    base = base or json.loads(config.read_text())["base_model_name_or_path"]
    return PeftModel.from_pretrained(Qwen2VLForConditionalGeneration.from_pretrained(str(base)), str(folder))


@pytest.fixture(scope="module")
def recipes(demo_recipes) -> dict[str, Path]:
    """The session's demo recipes (trained once per test session by conftest's `demo_recipes`)."""
    names = ["grounding-train", "grounding-eval", "grounding-base", "r1-llm-only", "r2-vision-only", "r3-stage1",
             "r3-stage2", "r4-joint"]
    return {name: demo_recipes.root / name for name in names}


@pytest.fixture(scope="module")
def scores(recipes) -> dict[str, dict]:
    rows = read_dataset(recipes["grounding-eval"])
    tokenizer, image_processor = load_vlm_parts(recipes["grounding-base"])

    def score(model) -> dict:
        return compute_metrics(evaluate_samples(model, tokenizer, image_processor, rows, max_new_tokens=32))

    results = {name: score(load_the_standard_way(recipes[name])) for name in ["grounding-base", *RECIPE_NAMES]}
    results["r3-stage2 on grounding-base"] = score(load_the_standard_way(recipes["r3-stage2"],
                                                                         base=recipes["grounding-base"]))
    return results


def _tensors(folder: Path) -> dict:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _same(a: dict, b: dict, keep) -> bool:
    keys = [k for k in a if keep(k)]
    assert keys and set(keys) == {k for k in b if keep(k)}
    return all(a[k].equal(b[k]) for k in keys)


def test_every_folder_is_written(recipes, demo_training):
    assert set(recipes) == {"grounding-train", "grounding-eval", "grounding-base", *(r.name for r in RECIPES)}
    assert len(read_dataset(recipes["grounding-train"])) == demo_training.train_samples
    assert len(read_dataset(recipes["grounding-eval"])) == demo_training.eval_samples
    for full in ("grounding-base", "r3-stage1"):
        names = {p.name for p in recipes[full].iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"} <= names


def test_adapters_record_the_base_they_were_trained_on(recipes):
    def recorded_base(name):
        return json.loads((recipes[name] / "adapter_config.json").read_text())["base_model_name_or_path"]

    for name in ("r1-llm-only", "r2-vision-only", "r4-joint"):
        assert recorded_base(name) == str(recipes["grounding-base"])
    assert recorded_base("r3-stage2") == str(recipes["r3-stage1"])      # the two-stage lineage


def test_each_recipe_trained_only_what_its_name_says(recipes, demo):
    def adapted(name):
        keys = _tensors(recipes[name]).keys()
        return {"vision" if ".visual." in k else "language" if ".language_model." in k else k for k in keys}

    assert adapted("r1-llm-only") == adapted("r3-stage2") == {"language"}
    assert adapted("r2-vision-only") == {"vision"}
    assert adapted("r4-joint") == {"vision", "language"}

    demo_base, base, stage1 = (_tensors(p) for p in (demo.qwen_base, recipes["grounding-base"], recipes["r3-stage1"]))
    assert _same(demo_base, base, lambda k: "visual" in k)               # the format base: language model + head
    assert not _same(demo_base, base, lambda k: "visual" not in k)
    assert _same(base, stage1, lambda k: "visual" not in k)              # stage 1: the vision tower only
    assert not _same(base, stage1, lambda k: "visual" in k)


def test_a_finished_build_is_reused(recipes, demo, demo_training):
    out_dir = recipes["r1-llm-only"].parent
    messages = []
    assert build_recipes(demo.qwen_base, out_dir, log=messages.append, settings=demo_training) == recipes
    assert messages == [f"recipes reused from {out_dir}"]


def test_training_is_deterministic(recipes, tmp_path):
    rows = read_dataset(recipes["grounding-train"])[:8]
    settings = TrainingSettings(steps=3, batch_size=4, warmup_steps=1)
    recipe = next(r for r in RECIPES if r.name == "r4-joint")
    first, second = (train_recipe(recipe, recipes["grounding-base"], rows, tmp_path / name, settings,
                                  log=lambda message: None) for name in ("a", "b"))
    a, b = _tensors(first), _tensors(second)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


@pytest.mark.full_demo_training
def test_the_format_base_writes_boxes_but_does_not_find_them(scores):
    base = scores["grounding-base"]
    assert base["detection_rate"] > 0.9
    assert base["mean_iou"] < 0.35


@pytest.mark.full_demo_training
@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_every_recipe_beats_its_base(scores, name):
    assert scores[name]["mean_iou"] > scores["grounding-base"]["mean_iou"] + 0.05, scores


@pytest.mark.full_demo_training
def test_the_two_stage_adapter_scores_lower_on_the_wrong_base(scores):
    right, wrong = scores["r3-stage2"], scores["r3-stage2 on grounding-base"]
    assert wrong["mean_iou"] < right["mean_iou"] - 0.1, (right, wrong)


def test_the_cli_can_tell_whether_notebook_05_must_train_the_recipes(demo_recipes, tmp_path):
    from workbench.demo.build import demo_recipes_ready

    assert demo_recipes_ready(demo_recipes.root.parent)  # the session's demo: trained
    assert not demo_recipes_ready(tmp_path / "demo")  # a fresh demo: notebook 05 would train them first
