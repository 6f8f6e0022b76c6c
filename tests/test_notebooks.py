import json
import re
from pathlib import Path

import pytest

import workbench

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
REPORT_NOTEBOOKS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)]  # what diagnose runs; panel.ipynb is not


def test_there_are_notebooks():
    assert any(p.stem == "01_dtype_distribution" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebooks_carry_no_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name} has outputs"


def test_the_panel_notebook_is_interactive_only():
    from workbench.runner import find_notebooks

    assert "panel" in [p.stem for p in NOTEBOOKS] and "panel" not in [p.stem for p in find_notebooks()]


@pytest.mark.parametrize("path", REPORT_NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_parameterized_and_declare_checks(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    assert nb["metadata"]["kernelspec"]["name"] == "workbench"
    assert nb["metadata"]["workbench"]["checks"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_use_only_the_public_surface(path):
    source = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    used = set(re.findall(r"\bwb\.(\w+)", source))
    assert used <= set(workbench.__all__), used - set(workbench.__all__)


def test_public_surface_is_sorted_and_exported():
    assert workbench.__all__ == sorted(workbench.__all__)
    assert all(hasattr(workbench, name) for name in workbench.__all__)
