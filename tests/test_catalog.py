"""The check catalog is the one source: the CLI prints it, the README's table is its markdown, the recorder and the
runner take check ids from it."""

import json
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import workbench_here
from workbench.catalog import CHECKS, NOTEBOOKS, markdown_table, notebook
from workbench.contract import ContractViolation
from workbench.findings import Finding
from workbench.recorder import FindingsRecorder

README = Path(__file__).resolve().parents[1] / "README.md"


def workbench_cli(*args):
    return workbench_here(*args)  # the CLI's entry point in this process (tests/cli_in_process.py)


def test_checks_prints_every_check_and_json_for_tools():
    text = workbench_cli("checks")
    assert text.returncode == 0 and all(c.id in text.stdout for c in CHECKS)
    data = json.loads(workbench_cli("checks", "--json").stdout)
    assert [c["id"] for c in data["checks"]] == [c.id for c in CHECKS]
    assert data["checks"][0]["verdicts"] and data["notebooks"][0]["steps"][0] == "files"


def test_the_readme_catalog_is_the_catalogs_markdown():
    assert markdown_table() in README.read_text(), "README's catalog table is stale: run `make docs`"
    assert workbench_cli("checks", "--markdown").stdout.strip() == markdown_table()


def test_a_crashing_step_reports_error_on_the_checks_it_declares(tmp_path):
    def planted(*args):
        raise RuntimeError("planted")
    step = notebook("04_forward_checks").step("forward")
    rec = FindingsRecorder(tmp_path / "f.json", notebook="04_forward_checks")
    failed = rec.run(planted, checks=step.reports, step=step.name)
    assert not failed and [(f.id, f.verdict) for f in rec.findings] == [("forward.scenarios", "error"),
                                                                        ("forward.dtype_flow", "error")]
    assert failed.named == "forward (forward.scenarios, forward.dtype_flow)"
    after = rec.run(lambda result: result, failed, checks=("grad.flow",), step="grads")
    error = next(f for f in rec.findings if f.id == "grad.flow")
    assert not after and "depends on step forward (forward.scenarios, forward.dtype_flow)" in error.detail
    assert error.evidence["depends_on_checks"] == ["forward.scenarios", "forward.dtype_flow"]


def test_a_finding_the_catalog_does_not_declare_is_refused(tmp_path):
    rec = FindingsRecorder(tmp_path / "f.json", notebook="04_forward_checks")
    with pytest.raises(ContractViolation, match=r"grad\.flw is not a check of workbench\.catalog"):
        rec.add(Finding("grad.flw", "pass", "a typo", ""))
    rec.run(lambda: type("R", (), {"findings": lambda self: [Finding("mine.check", "pass", "ok", "")]})(),
            checks=("mine.check",))
    assert [f.id for f in rec.findings] == ["mine.check"]  # named by the caller
    own = FindingsRecorder(tmp_path / "g.json", notebook="01_boom")  # a notebook of your own: its metadata declares
    own.add(Finding("boom.check", "pass", "fine", ""))
    assert [f.id for f in own.findings] == ["boom.check"]


def test_every_check_is_reported_by_a_step_and_every_step_reports_declared_checks():
    ids = {c.id for c in CHECKS}
    reported = {r for nb in NOTEBOOKS for s in nb.steps for r in s.reports}
    assert reported == ids
    for c in CHECKS:
        assert c.probes and all(s.probe in c.probes for s in c.steps)
        assert {s.probe for nb in NOTEBOOKS for s in nb.steps if c.id in s.reports} == set(c.probes)
        assert all(c.notebook == nb.name for nb in NOTEBOOKS for s in nb.steps if c.id in s.reports)


def test_a_step_is_found_by_its_probe_function():
    from workbench.probes.forward.grad_flow import grad_flow_probe

    assert notebook("04_forward_checks").step(grad_flow_probe).reports == ("grad.flow",)
    with pytest.raises(KeyError, match="grad_flow_probe"):
        notebook("01_dtype_distribution").step(grad_flow_probe)


def test_interactive_failures_keep_the_exception_for_debugging(tmp_path):
    def boom():
        raise ValueError("look at me in %debug")
    rec = FindingsRecorder(tmp_path / "f.json", notebook="x", interactive=True)
    failed = rec.run(boom)
    assert isinstance(failed.exception, ValueError) and sys.last_value is failed.exception
    assert sys.last_traceback is failed.exception.__traceback__ and "%debug" in failed.view().html()
    batch = FindingsRecorder(tmp_path / "g.json", notebook="x").run(boom)
    assert isinstance(batch.exception, ValueError)  # kept in batch runs too; only %debug's slot is left alone


def test_the_generated_docs_are_current_and_describe_every_check():
    from workbench.catalog_docs import checks_markdown, expected_files

    for path, text in expected_files().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: run `make docs`"
    docs = checks_markdown()
    for c in CHECKS:
        assert c.detail and f"### `{c.id}`" in docs and c.detail in docs


def test_where_names_the_probe_the_result_class_and_the_tests_of_every_check():
    from workbench.check_origin import REPO, check_origin

    for c in CHECKS:
        origin = check_origin(c.id)
        assert origin.probes and origin.steps == tuple(s.name for s in c.steps)
        for place in (*origin.probes, *origin.results):
            source = (REPO / place.path).read_text().splitlines()[place.line - 1]
            assert place.name.rsplit(".", 1)[-1] in source, (c.id, place)
    grad = check_origin("grad.flow")
    assert [p.name for p in grad.results] == ["GradFlowResult"]
    assert "test_healthy_family_gives_no_fail_and_names_its_inputs" in {t.name for t in grad.tests}
    text = workbench_cli("checks", "--where", "grad.flow")
    assert text.returncode == 0 and "workbench/probes/forward/grad_flow.py:" in text.stdout
    unknown = workbench_cli("checks", "--where", "grad.flw")
    assert unknown.returncode == 2 and "no such check" in unknown.stderr and "Traceback" not in unknown.stderr


def test_a_step_whose_probe_does_not_import_is_an_error_on_its_checks_and_the_notebook_goes_on(tmp_path):
    from workbench.catalog import NotebookSpec, Step
    from workbench.notebook import NotebookSession

    spec = NotebookSpec("04_forward_checks", "04", "Forward flow", (
        Step("gone", "a probe module that is not there", "workbench.probes.no_such_module:probe", (),
             reports=("grad.flow",)),
        Step("renamed", "a probe function that is not there", "workbench.findings:no_such_probe", (),
             reports=("forward.scenarios",))))
    rec = FindingsRecorder(tmp_path / "f.json", notebook="04_forward_checks")
    session = NotebookSession(spec, None, rec, {})
    session.run("gone")
    session.run("renamed")
    found = {f.id: f for f in rec.findings}
    assert found["grad.flow"].verdict == found["forward.scenarios"].verdict == "error"
    assert "no_such_module" in found["grad.flow"].title + found["grad.flow"].detail
    assert "no_such_probe" in found["forward.scenarios"].title + found["forward.scenarios"].detail
