"""The notebooks are source files that follow one contract: output-free, the parameters cell equal to
NOTEBOOK_PARAMETERS (as papermill reads it), and the steps each notebook runs equal to the catalog's sequence."""

import json
import re
from pathlib import Path

import papermill
import pytest

import workbench
from workbench.catalog import CHECKS, NOTEBOOKS, SWEEP_NOTEBOOK, notebook
from workbench.notebook import NOTEBOOK_PARAMETERS

NOTEBOOK_FILES = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# what diagnose runs: the numbered notebooks but the sweep's comparison (12_sweep, run once per sweep); panel.ipynb
# is interactive only
REPORT_NOTEBOOKS = [p for p in NOTEBOOK_FILES if re.match(r"\d\d_", p.name) and p.stem != SWEEP_NOTEBOOK]


def code_of(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def test_every_catalog_notebook_has_a_file_and_every_report_notebook_is_in_the_catalog():
    assert [p.stem for p in REPORT_NOTEBOOKS] == [nb.name for nb in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_committed_notebooks_carry_no_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name} has outputs"


def test_the_sweep_notebook_is_numbered_but_no_report_notebook():
    """12_sweep compares a sweep's members: `diagnose` never runs it on one checkpoint, and it answers no check."""
    from workbench.report.runner import find_notebooks

    assert SWEEP_NOTEBOOK in [p.stem for p in NOTEBOOK_FILES]
    assert SWEEP_NOTEBOOK not in [p.stem for p in find_notebooks()]
    assert SWEEP_NOTEBOOK not in [nb.name for nb in NOTEBOOKS] and not any(c.notebook == SWEEP_NOTEBOOK for c in CHECKS)
    declared = papermill.inspect_notebook(str(next(p for p in NOTEBOOK_FILES if p.stem == SWEEP_NOTEBOOK)))
    assert list(declared) == ["sweep_dir", "history"]


def test_the_panel_notebook_is_interactive_only():
    from workbench.report.runner import find_notebooks

    assert "panel" in [p.stem for p in NOTEBOOK_FILES] and "panel" not in [p.stem for p in find_notebooks()]


@pytest.mark.parametrize("path", REPORT_NOTEBOOKS, ids=lambda p: p.stem)
def test_the_parameters_cell_is_the_contract(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    assert nb["metadata"]["kernelspec"]["name"] == "workbench"
    declared = papermill.inspect_notebook(str(path))
    assert list(declared) == list(NOTEBOOK_PARAMETERS)
    for name, default in NOTEBOOK_PARAMETERS.items():
        assert eval(declared[name]["default"]) == default, name  # noqa: S307 - our own committed literal


@pytest.mark.parametrize("path", REPORT_NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_runs_the_catalog_steps_in_order_and_its_last_cell_the_rest(path):
    """A cell per step is for the prose around it: the last cell (`nb.finish()`) runs every step no cell named, so a
    step added to the catalog reaches the report without a notebook edit."""
    source = code_of(path)
    assert f'wb.open_notebook("{path.stem}", parameters=globals())' in source
    named = re.findall(r'nb\.run\("(\w+)"\)', source)
    catalog_order = [s.name for s in notebook(path.stem).steps]
    assert named == [name for name in catalog_order if name in named]  # the catalog's order, each step once
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert "".join(cells[-1]["source"]).startswith("nb.finish()")


def test_the_catalog_is_consistent():
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
    names = {nb.name for nb in NOTEBOOKS}
    for c in CHECKS:
        assert c.notebook in names and c.verdicts and set(c.verdicts) <= set(workbench.catalog.VERDICTS), c.id
    for nb in NOTEBOOKS:
        seen = {"target"}
        for step in nb.steps:  # inputs name earlier steps, and every probe resolves
            for ref in (*step.args, *step.kwargs.values()):
                if ref == "prepared?":  # the shared model, optional: the callback's pre-flight seeds it live
                    continue
                if not ref.startswith(("params.", "option.")):
                    assert ref.rstrip("?") in seen, (nb.name, step.name, ref)
            assert callable(step.function()), step.probe
            seen.add(step.name)
        reported = {c for s in nb.steps for c in s.reports}
        assert reported == set(nb.checks), nb.name  # every check of the notebook is answered by one of its steps


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_notebooks_use_only_the_public_surface(path):
    used = set(re.findall(r"\bwb\.(\w+)", code_of(path)))
    assert used <= set(workbench.__all__), used - set(workbench.__all__)


def test_every_public_name_loads_lazily_from_the_module_that_defines_it():
    for name in workbench.__all__:
        value = getattr(workbench, name)  # the PEP 562 hook imports its module on first use
        # `explain` is a callable package: once imported, the attribute is the package workbench.explain itself
        assert getattr(value, "__name__", name).rpartition(".")[2] == name and (callable(value) or name.isupper()), name
