from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from workbench.demo.build import DemoPaths, DemoRecipes, build_demo, build_demo_recipes  # noqa: E402
from workbench.runtime import quiet_and_offline  # noqa: E402

quiet_and_offline()


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> DemoPaths:
    """The bundled demo, built once per test session into a temporary cache."""
    return build_demo(tmp_path_factory.mktemp("cache") / "demo")


@pytest.fixture(scope="session")
def demo_recipes(demo) -> DemoRecipes:
    """The demo's four recipes, trained once per test session beside the session's demo (a few minutes)."""
    return build_demo_recipes(demo.root, log=lambda *_: None)


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """`family("qwen2_tied")` -> the folder of a tiny healthy checkpoint of that family (workbench.demo.families),
    built once per test session."""
    from workbench.demo.families import build_family

    parent = tmp_path_factory.mktemp("families")
    return lambda name: build_family(name, parent)


@pytest.fixture
def contract_notebook():
    """A report notebook of your own: the contract's parameters cell, then `body`; it declares `checks`."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from workbench.notebook import NOTEBOOK_PARAMETERS

    def make(body: str, checks: list[str]) -> nbformat.NotebookNode:
        nb = new_notebook()
        params = new_code_cell("\n".join(f"{k} = {v!r}" for k, v in NOTEBOOK_PARAMETERS.items()))
        params.metadata["tags"] = ["parameters"]
        nb.cells = [params, new_code_cell(body)]
        nb.metadata["kernelspec"] = {"name": "workbench", "display_name": "workbench", "language": "python"}
        nb.metadata["workbench"] = {"checks": checks}
        return nb
    return make


@pytest.fixture
def copy_of(tmp_path):
    """Copy a checkpoint folder so a test can damage it."""
    def make(folder: Path, name: str | None = None) -> Path:
        dest = tmp_path / (name or folder.name)
        shutil.copytree(folder, dest)
        return dest
    return make


@pytest.fixture
def edit_json():
    """Change keys of a JSON file in place (a copied checkpoint's config.json, adapter_config.json, index)."""
    import json

    def edit(path: Path, **changes) -> dict:
        data = json.loads(path.read_text())
        data.update(changes)
        path.write_text(json.dumps(data))
        return data
    return edit


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
