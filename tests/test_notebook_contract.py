"""One notebook contract: the target's options round-trip, one call opens a notebook, and the runner refuses
parameters a notebook does not declare."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from workbench.model.target import resolve_target
from workbench.notebook import NOTEBOOK_PARAMETERS, TARGET_OPTIONS, open_notebook, parameters_cell_mismatch


@pytest.mark.parametrize("options", [
    {},
    {"quant": "4bit", "gpus": 2, "setup": "qlora", "dtype": "bf16"},
    {"device_map": '{"": "cpu"}', "max_memory": "0=20GiB,cpu=64GiB", "params_json": '{"components": {"head": ["x"]}}'},
    {"device_map": "0", "trust_remote_code": True, "allow_pickle": True},
])
def test_options_and_resolve_target_are_inverses(demo, options):
    target = resolve_target(str(demo.llama), **options)
    assert set(target.options()) == set(TARGET_OPTIONS)
    again = resolve_target(**target.options())
    assert again == target and again.options() == target.options()
    assert json.loads(json.dumps(target.options())) == target.options()  # what papermill and torchrun ranks get


def test_options_round_trip_for_an_adapter_with_an_overridden_base(demo):
    target = resolve_target(str(demo.qwen_stage2), base=str(demo.qwen_base), quant="8bit")
    again = resolve_target(**target.options())
    assert again == target and again.base_source == "--base" and again.recorded_base == str(demo.qwen_stage1)


def test_open_notebook_resolves_runs_steps_and_records(demo, tmp_path):
    nb = open_notebook("01_dtype_distribution", {"checkpoint": str(demo.llama),
                                                 "findings_path": str(tmp_path / "f.json"), "unrelated": 1})
    static = nb.run("static")
    assert nb.results["static"] is static and nb.target.model_dir == demo.llama
    assert [f.id for f in nb.recorder.findings] == ["checkpoint.integrity"]
    assert json.loads((tmp_path / "f.json").read_text())["notebook"] == "01_dtype_distribution"
    with pytest.raises(KeyError, match="run nb.run\\('prepared'\\) first"):
        nb.run("census")


def test_the_last_cell_runs_every_catalog_step_without_a_cell_of_its_own(demo, tmp_path, monkeypatch):
    import dataclasses

    from workbench import catalog

    spec = catalog.notebook("00_saved_files")
    # the catalog gains a step no notebook cell names: `finish` runs it, after the cells' own steps
    gained = dataclasses.replace(spec.steps[-1], name="generation_again", label="generation_config.json, again",
                                 reports=())
    monkeypatch.setattr(catalog, "NOTEBOOKS", tuple(
        dataclasses.replace(nb, steps=(*nb.steps, gained)) if nb.name == spec.name else nb for nb in catalog.NOTEBOOKS))
    nb = open_notebook("00_saved_files", checkpoint=str(demo.qwen_stage2), findings_path=str(tmp_path / "f.json"))
    assert all(check in nb.view().text() for check in spec.checks)  # the opening cell lists the catalog's checks
    nb.run("files")
    nb.run("weights")
    finished = nb.finish()
    shown = str(finished)
    html = finished._repr_mimebundle_()["text/html"]  # what the notebook's last cell renders in a report
    assert "Findings · 00_saved_files" in html and "adapter.weights" in html
    assert list(nb.results) == [s.name for s in (*spec.steps, gained)]  # in the catalog's order, each once
    assert {f.id for f in nb.recorder.findings} == set(spec.checks)  # every check answered
    assert "Steps of the catalog without a cell above" in shown and "generation_config.json, again" in shown
    assert "the adapter's weights" not in shown  # a step a cell ran is not shown again
    assert "Steps of the catalog" not in str(nb.finish())  # nothing left: the findings alone


def test_open_notebook_without_a_checkpoint_opens_the_demo_as_make_diagnose_does(demo, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(demo.root.parent))
    nb = open_notebook("02_dataparallel", findings_path=str(tmp_path / "f.json"))
    assert nb.target.adapter_dir == demo.qwen_stage2 and nb.target.quant == "4bit" and nb.target.gpus == 2
    assert nb.target.params["compare"] == [str(demo.qwen_base)]


def test_the_runner_refuses_parameters_a_notebook_does_not_declare(tmp_path):
    nb = new_notebook()
    cell = new_code_cell("checkpoint = ''\nquant = 'none'")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "workbench", "display_name": "workbench", "language": "python"}
    path = tmp_path / "07_custom.ipynb"
    nbformat.write(nb, path)
    assert parameters_cell_mismatch(path, {"checkpoint": "x"}) is None
    assert "lacks ['gpus']" in parameters_cell_mismatch(path, {"checkpoint": "x", "gpus": 2})
    from workbench.report.runner import run_notebook

    run = run_notebook(path, tmp_path, dict(NOTEBOOK_PARAMETERS), "workbench")
    assert run.status == "error" and "parameters contract broken" in run.error
