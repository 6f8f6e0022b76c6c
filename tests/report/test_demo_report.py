"""What `make diagnose` says about the bundled demo, one claim per test, over one shared run (`demo_report`: no CKPT ->
the demo's stage-2 adapter, 4-bit, the QLoRA set-up with older trl's casting, 2 GPUs; the recipes already trained)."""

import datetime as dt
import json

import pytest

from workbench.catalog import CHECKS, NOTEBOOKS, notebook

pytestmark = pytest.mark.slow
CONTRACT_KEYS = {"schema_version", "run_id", "created", "target", "environment", "notebooks", "findings"}


@pytest.fixture(scope="module")
def report(demo_report):
    return json.loads((demo_report.folder / "findings.json").read_text())


@pytest.fixture(scope="module")
def verdicts(report):
    return {f["id"]: f["verdict"] for f in report["findings"]}


def finding(report, check_id):
    return next(f for f in report["findings"] if f["id"] == check_id)


def page(demo_report, name):
    return (demo_report.folder / name).read_text()


def test_the_run_exits_1_on_the_planted_crash_and_prints_where_the_report_is(demo_report):
    result, folder = demo_report.result, demo_report.folder
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"report: {folder}"
    summary = [line for line in result.stdout.splitlines() if line.startswith(("FAIL ", "ERROR "))]
    assert [line.split(":")[0] for line in summary] == ["FAIL forward.dtype_flow", "FAIL forward.scenarios"]
    assert folder.parent.name == dt.date.today().isoformat()
    assert not list(demo_report.reports.glob("*/.*partial"))


def test_findings_json_keeps_the_contract_and_reports_every_check_of_the_catalog(report, verdicts, demo):
    assert CONTRACT_KEYS <= set(report)
    assert set(verdicts) == {c.id for c in CHECKS}
    # the demo is not a Trainer output_dir, and is diagnosed without --training-args (no memory plan)
    ran = [nb.name for nb in NOTEBOOKS if not nb.trainer_output_only and not nb.training_args_only]
    assert [n["name"] for n in report["notebooks"]] == ran and {n["status"] for n in report["notebooks"]} == {"ok"}
    target = report["target"]
    assert target["base"] == str(demo.qwen_stage1) and target["quant"] == "4bit" and target["gpus"] == 2


def test_the_saved_files_are_healthy_the_defects_are_in_the_set_up(verdicts):
    assert {verdicts[c] for c in set(notebook("00_saved_files").checks) - {"adapter.targets"}} == {"pass"}
    assert verdicts["adapter.targets"] == "info"


def test_the_census_is_whole_and_the_quantized_prediction_agrees_with_the_real_load(verdicts, demo_report):
    assert verdicts["checkpoint.integrity"] == verdicts["dtype.quantized_census"] == "pass"
    html = page(demo_report, "01_dtype_distribution.html")
    assert "qwen2vl-base: predicted 4bit" in html and "tensors per component by dtype</text>" in html


def test_fp32_norms_before_a_bf16_head_are_a_warned_island(verdicts):
    assert verdicts["dtype.fp32_islands"] == "warn"


def test_the_trainer_doubles_the_batch_and_older_releases_crash_in_the_replica(report):
    wrap = finding(report, "parallel.trainer_wrap")
    assert wrap["verdict"] == "warn" and "136 → 68" in wrap["title"] and "BFloat16" in wrap["detail"]


def test_peft_attributes_survive_and_the_chain_is_shown(verdicts, demo_report):
    assert verdicts["peft.attributes"] == "info" and verdicts["peft.layer_status"] in ("pass", "info")
    assert "PeftModel.from_pretrained" in page(demo_report, "03_peft_attributes.html")


def test_the_forward_fails_at_lm_head_on_the_norms_fp32_output_and_gradients_flow(report, verdicts):
    assert verdicts["forward.scenarios"] == verdicts["forward.dtype_flow"] == "fail"
    flow = finding(report, "forward.dtype_flow")
    assert "lm_head" in flow["title"] and "norm" in flow["title"]
    assert verdicts["grad.flow"] == "pass"


def test_the_trained_recipes_are_scored_each_on_its_recorded_base(report, verdicts, demo_report, demo_training):
    metrics = finding(report, "eval.metrics")
    assert metrics["verdict"] == "pass" and metrics["title"].startswith("Best: r")
    assert f"on {demo_training.eval_samples} sample(s)" in metrics["detail"]
    assert {"metric", "best", "base", "absolute"} <= set(metrics["evidence"]["gain_over_base"])
    assert verdicts["adapter.base_model"] == verdicts["placement.offload"] == verdicts["eval.memory"] == "pass"
    evaluation = page(demo_report, "05_evaluation.html")
    assert "Mean IoU" in evaluation and "Best recipe" in evaluation and "data:image/png;base64" in evaluation
    assert "r3-stage1" in evaluation and "<svg" in evaluation  # r3-two-stage's lineage chain


@pytest.mark.full_demo_training
def test_the_recipes_trained_on_the_full_schedule_beat_the_base(report):
    assert finding(report, "eval.metrics")["evidence"]["gain_over_base"]["absolute"] > 0.2


def test_notebooks_not_asked_for_say_skip_and_how_to_ask(report, verdicts):
    assert verdicts["distributed.ddp"] == verdicts["distributed.fsdp"] == "skip"
    assert {verdicts[c] for c in notebook("07_data_path").checks} == {"skip"}
    assert "--data FILE" in finding(report, "data.labels")["detail"]


def test_one_kernel_ran_everything_and_the_report_says_what_it_cost(report, demo_report):
    cost = report["cost"]
    assert cost["kernels_started"] == 1 and {n["kernel"] for n in report["notebooks"]} == {"shared"}
    assert cost["model_loads"] == len(cost["loads"]) and cost["peak_rss_bytes"] > 0
    assert all(load["why"] for load in cost["loads"]), cost["loads"]  # each load says why it was made
    assert set(cost["notebook_seconds"]) == {n["name"] for n in report["notebooks"]}
    # each probe step timed, inside the time of the notebook it ran in; its name and checks are the catalog's
    for name, seconds in cost["notebook_seconds"].items():
        steps = [s for s in cost["steps"] if s["notebook"] == name]
        catalog = {step.name: step.reports for step in notebook(name).steps}
        assert steps and all(s["step"] in catalog and tuple(s["checks"]) == catalog[s["step"]] for s in steps), name
        assert 0 <= sum(s["seconds"] for s in steps) <= seconds, (name, steps, seconds)
    assert "The slowest probe steps" in page(demo_report, "index.html")
    output = demo_report.result.stdout + demo_report.result.stderr
    assert "IPKernelApp" not in output and (demo_report.folder / "kernel.log").exists()


def test_every_notebook_page_ends_with_its_findings(report, demo_report):
    # the last cell (`nb.finish()`) renders the notebook's findings table, not an object's repr
    for row in report["notebooks"]:
        html = page(demo_report, f"{row['name']}.html")
        assert f"Findings · {row['name']}" in html and "workbench.display" not in html, row["name"]


def test_pages_hide_code_behind_one_click_and_fetch_nothing(demo_report):
    html = page(demo_report, "01_dtype_distribution.html")
    assert '<script src="http' not in html
    # code hidden, one click away; markdown (also in .jp-Cell-inputWrapper in the lab template) stays visible
    assert ".jp-CodeCell .jp-Cell-inputWrapper { display: none; }" in html and "show code" in html
    assert "\n.jp-Cell-inputWrapper { display: none; }" not in html  # unscoped, it would hide markdown


def test_the_index_leads_with_the_worst_verdict_and_links_every_notebook(report, demo_report):
    from html.parser import HTMLParser

    class Links(HTMLParser):
        def __init__(self):
            super().__init__()
            self.hrefs, self.h1 = [], ""
            self._in_h1 = False

        def handle_starttag(self, tag, attrs):
            self.hrefs += [v for k, v in attrs if tag == "a" and k == "href"]
            self._in_h1 = self._in_h1 or tag == "h1"

        def handle_endtag(self, tag):
            self._in_h1 = self._in_h1 and tag != "h1"

        def handle_data(self, data):
            if self._in_h1:
                self.h1 += data

    index = Links()
    index.feed(page(demo_report, "index.html"))
    assert index.h1.split() == ["Diagnosis", "FAIL"]
    assert {f"{n['name']}.html" for n in report["notebooks"]} <= set(index.hrefs)
    assert "findings.json" in index.hrefs and "model loads" in page(demo_report, "index.html")
    assert demo_report.folder.name in (demo_report.reports / "index.html").read_text()  # the runs index lists it
