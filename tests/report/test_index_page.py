"""index.html built from a findings.json: the headline names which folder of a Trainer output_dir was diagnosed."""

from pathlib import Path

from workbench.findings import Finding
from workbench.model.target import TrainerOutput
from workbench.report.index_page import index_view, render_index


def findings_json(target: dict) -> dict:
    """A findings.json as the runner writes it (schema version 1), with one failing run.loss finding."""
    return {"schema_version": 1, "run_id": "20250101-120000-out", "created": "2025-01-01T12:00:00+00:00",
            "target": target, "environment": {"python": "3.11", "transformers": "5.23.0"},
            "notebooks": [{"name": "08_training_run", "status": "ok", "html": "08_training_run.html", "seconds": 3.0}],
            "findings": [Finding("run.loss", "fail", "NaN logged as loss 0.0 from step 8", "", {}, "Restart from "
                                 "checkpoint-5.", "08_training_run").to_dict()]}


def headline(text: str) -> str:
    """The page's text above the findings list."""
    return text.split("Findings, worst first", 1)[0]


def test_the_headline_names_the_diagnosed_folder_of_a_trainer_run(tmp_path):
    run_dir = tmp_path / "out"
    described = TrainerOutput(run_dir, run_dir / "checkpoint-20", (10, 20), final_save=False).describe()
    report = findings_json({"checkpoint": str(run_dir), "model_dir": str(run_dir / "checkpoint-20"), "quant": "none",
                            "gpus": 0, "run": described})
    top = headline(index_view(report).text())
    assert f"Diagnosed: {described}" in top and "no final save at the root" in top
    assert top.index("Diagnosed:") < top.index("NaN logged as loss 0.0")
    html = render_index(report)
    assert html.index("checkpoint-20 of") < html.index("Findings, worst first")


def test_a_plain_checkpoint_has_no_run_line(tmp_path):
    report = findings_json({"checkpoint": str(Path(tmp_path) / "model"), "quant": "none", "gpus": 0})
    top = headline(index_view(report).text())
    assert "Diagnosed:" not in top and "NaN logged as loss 0.0" in top


def test_the_cost_lists_each_load_with_why_it_was_made(tmp_path):
    report = findings_json({"checkpoint": str(Path(tmp_path) / "model"), "quant": "none", "gpus": 0})
    report["cost"] = {"model_loads": 2, "kernels_started": 1, "seconds": 9.5, "peak_rss_bytes": None, "loads": [
        {"notebook": "01_dtype_distribution", "quant": "4bit", "seconds": 0.5, "why": "the model the set-up prepares"},
        {"notebook": "03_peft_attributes", "quant": "4bit", "seconds": 0.4,
         "why": "peft.attributes: the raw model the wrapping chain walks"}]}
    text = index_view(report).text()
    cost = text.split("Cost", 1)[1]
    assert "2 model loads (1 in 01, 1 in 03)" in cost
    assert cost.index("the model the set-up prepares") < cost.index("peft.attributes: the raw model")
    assert "peft.attributes: the raw model the wrapping chain walks" in render_index(report)
    del report["cost"]
    assert "model loads" not in index_view(report).text()


def test_the_cost_names_the_slowest_probe_steps_first(tmp_path):
    from workbench.report.index_page import SLOWEST_STEPS

    report = findings_json({"checkpoint": str(Path(tmp_path) / "model"), "quant": "none", "gpus": 0})
    steps = [{"notebook": "04_forward_checks", "step": f"step{i}", "checks": [f"check.{i}"], "seconds": i / 10}
             for i in range(SLOWEST_STEPS + 3)]
    report["cost"] = {"model_loads": 1, "kernels_started": 1, "seconds": 9.5, "peak_rss_bytes": None, "loads": [],
                      "steps": steps}
    cost = index_view(report).text().split("Cost", 1)[1]
    assert f"The slowest probe steps (of {len(steps)})" in cost
    shown = [f"step{i}" for i in range(len(steps)) if f"step{i} " in cost or f"step{i}\n" in cost]
    assert shown == [f"step{i}" for i in range(3, SLOWEST_STEPS + 3)]  # the eight slowest, the slowest first
    assert cost.index(f"step{SLOWEST_STEPS + 2}") < cost.index("step3")
    # the full-model forwards it ran, and the kernel's peak memory during it
    report["cost"]["steps"][-1].update(forwards=3, forwards_with_grad=1, peak_rss_bytes=1_230_000_000)
    assert "3 (1 with autograd)" in index_view(report).text().split("Cost", 1)[1]
    assert "1.23 GB" in index_view(report).text().split("Cost", 1)[1]
    # a step that declares no check (its result judged by a later step)
    report["cost"]["steps"] = [{"notebook": "01_dtype_distribution", "step": "quantized", "checks": [], "seconds": 0.9}]
    assert "none declared" in index_view(report).text().split("Cost", 1)[1]
    for malformed in ([{"seconds": "x"}, "not a step"], {"step": "x"}, 7):  # another writer's block: no crash
        report["cost"]["steps"] = malformed
        assert "slowest probe steps" not in index_view(report).text()
