"""Notebook 05's probes on the demo: adapter lineage, placement, recipe lists and the evaluation loop (the trained
recipes themselves are tested in test_recipe_training.py)."""


import pytest

import workbench as wb
from tests.cli_in_process import workbench_here
from workbench.probes.evaluation.evaluate import EvaluationResult, RecipeOutcome, evaluate_recipes
from workbench.probes.evaluation.lineage import adapter_lineage
from workbench.probes.evaluation.placement import placement_of
from workbench.probes.evaluation.recipes import read_recipes, recipes_for
from workbench.tasks.grounding import write_dataset


def verdict(report, check):
    return next(f for f in report.findings() if f.id == check)


def test_the_stage2_adapter_resolves_to_stage1_and_passes(demo):
    target = wb.resolve_target(str(demo.qwen_stage2))
    report = wb.adapter_lineage_probe(target, reference=str(demo.qwen_base))
    finding = verdict(report, "adapter.base_model")
    assert finding.verdict == "pass" and "qwen2vl-stage1" in finding.title
    assert report.checked_modules == 28 and not report.shape_mismatches
    assert [n.label for n in report.chain] == ["qwen2vl-base", "qwen2vl-stage1", "qwen2vl-stage2"]
    assert "changed: vision (31 tensors); identical: head, language" in report.edges[0][2]  # stage 1 = base + vision


def test_overriding_the_base_with_the_original_model_fails_naming_both(demo):
    target = wb.resolve_target(str(demo.qwen_stage2), base=str(demo.qwen_base))
    report = wb.adapter_lineage_probe(target)
    finding = verdict(report, "adapter.base_model")
    assert finding.verdict == "fail"
    assert str(demo.qwen_base) in finding.title and str(demo.qwen_stage1) in finding.title
    diff = report.base_differences
    assert diff["vision"]["different"] == 31 and diff["language"]["different"] == 0
    assert "⇒ qwen2vl-stage2" in report.chain_text() and "<svg" in report.view().html()


def test_an_adapter_on_another_architecture_fails_on_module_shapes(demo):
    report = adapter_lineage(demo.qwen_stage2, demo.llama, "--base")
    finding = verdict(report, "adapter.base_model")
    assert finding.verdict == "fail" and report.shape_mismatches
    assert "the base has no module" in report.shape_mismatches[0]["problem"]


def test_a_missing_recorded_base_is_an_error_naming_the_path(demo, copy_of, edit_json, tmp_path):
    adapter = copy_of(demo.qwen_stage2)
    edit_json(adapter / "adapter_config.json", base_model_name_or_path=str(tmp_path / "gone-stage1"))
    report = adapter_lineage(adapter, demo.qwen_stage1, "--base")
    finding = verdict(report, "adapter.base_model")
    assert finding.verdict == "error" and "gone-stage1" in finding.detail
    result = workbench_here("diagnose", adapter, "--notebooks", "05", "--reports-dir", tmp_path / "r")
    assert result.returncode == 2 and "gone-stage1" in result.stderr and "Traceback" not in result.stderr


def test_forced_offload_is_flagged_with_its_modules_and_flash_attention_fails(demo):
    from workbench.model.loading import load_pretrained

    model = load_pretrained(demo.llama, device_map="auto", max_memory={"cpu": "200KB"})
    report = placement_of(model, "llama")
    finding = verdict(report, "placement.offload")
    assert finding.verdict == "warn" and "lm_head → disk" in finding.detail
    assert finding.evidence["offloaded_bytes"] >= 51_200  # lm_head alone is 400 x 64 bf16
    model.config._attn_implementation = "flash_attention_2"
    assert verdict(placement_of(model, "llama"), "placement.offload").verdict == "fail"

    healthy = load_pretrained(demo.llama)
    assert verdict(placement_of(healthy, "llama"), "placement.offload").verdict == "pass"


def test_recipes_file_problems_are_usage_errors(tmp_path):
    bad = tmp_path / "recipes.yaml"
    for text, message in [("recipes: []", "non-empty"), ("recipes: [{path: x}]\nextra: 1", "unknown key"),
                          ("recipes: [{name: a}]", "needs at least `path:`"),
                          ("recipes: [{path: x, kind: merged}]", "kind 'merged'")]:
        bad.write_text(text)
        with pytest.raises(wb.UsageError, match=message):
            read_recipes(bad)
    with pytest.raises(wb.UsageError, match="does not exist"):
        read_recipes(tmp_path / "nope.yaml")


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    folder = write_dataset(tmp_path_factory.mktemp("grounding"), 3, seed=7)
    with open(folder / "data.jsonl", "a") as fh:
        fh.write("{not json\n")
    return folder


def test_a_recipe_that_cannot_load_is_an_error_row_and_the_others_evaluate(demo, tiny_dataset, tmp_path, copy_of,
                                                                          edit_json):
    orphan = copy_of(demo.qwen_stage2, "orphan")
    edit_json(orphan / "adapter_config.json", base_model_name_or_path=str(tmp_path / "deleted-stage1"))
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(f"base: {demo.qwen_base}\ndataset: {tiny_dataset}\nmax_new_tokens: 6\nrecipes:\n"
                       f"  - {{name: stage2, path: {demo.qwen_stage2}}}\n"
                       f"  - {{name: missing, path: {tmp_path / 'no-such-recipe'}}}\n"
                       f"  - {{name: orphan, path: {orphan}}}\n")
    target = wb.resolve_target(str(demo.qwen_base), params={"recipes": str(recipes)})
    report = evaluate_recipes(recipes_for(target, str(recipes)), target)
    rows = {r["Model"]: r for r in report.table()}
    assert set(rows) == {"qwen2vl-base (base)", "stage2", "missing", "orphan"}
    assert "does not exist" in rows["missing"]["error"] and rows["stage2"]["n"] == 3
    assert "deleted-stage1" in rows["orphan"]["error"]
    assert report.unreadable_rows and "line 4" in report.unreadable_rows[0]
    metrics = verdict(report, "eval.metrics")
    assert metrics.verdict == "warn" and "missing" in metrics.detail
    lineage = verdict(report, "adapter.base_model")  # stage2 on stage1 passes; the orphan's base is gone
    assert lineage.verdict == "error" and "deleted-stage1" in lineage.detail and "stage2: pass" in lineage.detail
    assert verdict(report, "placement.offload").verdict == "pass"
    assert all(o.memory["peak"] >= o.memory["before"] > 0 for o in report.outcomes)
    assert "Memory per recipe" in report.view().html() and "stage2" in str(report)


def test_memory_growth_between_recipes_is_flagged():
    def outcome(name, after_free):
        return RecipeOutcome(name, "full", name, memory={"before": 0, "peak": 2 * 2**30, "after_free": after_free,
                                                         "model_bytes": 2**30, "seconds": 1.0})
    healthy = EvaluationResult([outcome("base", 3 * 2**30), outcome("r1", 3 * 2**30 + 2**20)], "base", None, 0, [],
                               "test", "RSS")
    assert verdict(healthy, "eval.memory").verdict == "pass"
    leaky = EvaluationResult([outcome("base", 3 * 2**30), outcome("r1", 4 * 2**30)], "base", None, 0, [], "test",
                             "RSS")
    finding = verdict(leaky, "eval.memory")
    assert finding.verdict == "warn" and "r1 (+1024 MiB" in finding.detail


def test_cli_recipes_flag_refuses_an_unusable_file(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("recipes: nope")
    result = workbench_here("diagnose", tmp_path, "--recipes", bad, cwd=tmp_path)
    assert result.returncode == 2 and "recipes" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "reports").exists()


def test_a_copy_of_the_recorded_base_is_not_a_wrong_base(demo, copy_of):
    copy = copy_of(demo.qwen_stage1, "stage1-copy")
    report = adapter_lineage(demo.qwen_stage2, copy, "--base")
    finding = verdict(report, "adapter.base_model")
    assert finding.verdict == "info" and "copy" in finding.title and report.same_weights


def test_a_recorded_hub_id_that_is_not_cached_is_unverifiable_not_an_error(demo, copy_of, edit_json):
    adapter = copy_of(demo.qwen_stage2)  # a hub id no cache holds: the offline lookup misses on any machine
    edit_json(adapter / "adapter_config.json", base_model_name_or_path="workbench-tests/never-published-base")
    finding = verdict(adapter_lineage(adapter, demo.qwen_stage1, "--base"), "adapter.base_model")
    assert finding.verdict == "warn" and "not available offline" in finding.title


def test_a_dataset_with_no_usable_row_is_an_error_not_a_pass(demo, tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "data.jsonl").write_text("{broken\n")
    # the demo's VLM, which the metrics can score (a text-only model is a skip: test_heads.py)
    target = wb.resolve_target(str(demo.qwen_base), params={"eval_dataset": str(tmp_path / "ds")})
    report = evaluate_recipes(recipes_for(target), target)
    metrics = verdict(report, "eval.metrics")
    assert metrics.verdict == "error" and "no usable row" in metrics.title


def test_recipe_paths_are_relative_to_the_recipes_file_not_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "cwd" / "final").mkdir(parents=True)
    (tmp_path / "runs" / "final").mkdir(parents=True)
    listing = tmp_path / "runs" / "recipes.yaml"
    listing.write_text("recipes:\n  - {name: a, path: final}\n")
    monkeypatch.chdir(tmp_path / "cwd")
    assert read_recipes(listing).recipes[0].folder() == (tmp_path / "runs" / "final").resolve()
    listing.write_text("recipes:\n  - {path: final}\n  - {path: ../cwd/final}\n")
    with pytest.raises(wb.UsageError, match="names must differ"):
        read_recipes(listing)


@pytest.mark.cuda
def test_on_a_gpu_memory_is_measured_as_cuda_allocated_and_freed_between_recipes(demo, tiny_dataset, tmp_path):
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(f"base: {demo.qwen_base}\ndataset: {tiny_dataset}\nmax_new_tokens: 4\nrecipes:\n"
                       f"  - {{name: stage2, path: {demo.qwen_stage2}}}\n")
    target = wb.resolve_target(str(demo.qwen_base), device_map='{"": 0}')
    report = evaluate_recipes(recipes_for(target, str(recipes)), target)
    assert report.memory_kind == "CUDA allocated"
    assert all(o.memory["peak"] > o.memory["after_free"] for o in report.outcomes)
    assert verdict(report, "eval.memory").verdict == "pass"
    assert verdict(report, "placement.offload").verdict == "pass"
