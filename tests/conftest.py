from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The cyclic collector is off while this process imports what collection imports (torch, transformers, every test
# module): each collection it would start scans every object imported so far (~1 s of a worker's collection on this
# project's machine). `pytest_collection_finish` turns it back on and freezes what lives; xdist's controller, which
# collects nothing, turns it on in `pytest_configure`.
gc.disable()

from tests.verdict_coverage import pytest_configure as configure_verdict_log  # noqa: E402
from tests.verdict_coverage import (  # noqa: E402, F401 - pytest hooks
    pytest_configure_node,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: one thread each, for torch here and for every kernel and torchrun
    # rank they start (inherited). With torch's default of two threads each, the OpenMP pools spin against each
    # other: 19.7 min of CPU for what takes 10.4 min in one process.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# The check contract raises here instead of becoming an `error` finding (workbench.contract): kernels, torchrun ranks
# and every subprocess inherit it.
os.environ["WORKBENCH_STRICT_CONTRACT"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests import served_hub, served_kernels  # noqa: E402
from tests.shared_builds import built_once, shared_demo  # noqa: E402
from workbench.demo.build import DemoPaths, DemoRecipes, build_demo_recipes  # noqa: E402
from workbench.runtime import quiet_and_offline, skip_slow_optional_imports  # noqa: E402

quiet_and_offline()
# as the CLI's own process does: jsonschema's optional IRI checker compiles its grammars on import (6 s of each
# worker's collection, through nbformat), and nothing the tests validate asks for it
skip_slow_optional_imports()


@pytest.fixture(autouse=True)
def isolated_shared_model():
    """Each test starts with no shared model, no early results and no recorded loads of an earlier test."""
    yield
    from workbench.model import shared
    from workbench.model.loading import LOADS

    shared.reset()
    LOADS.clear()


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> DemoPaths:
    """The bundled demo, built once per test session into a temporary cache shared by the workers."""
    return shared_demo(tmp_path_factory)


# The demo recipes' schedule in `make test`: every recipe and folder of the write-up's (docs/demo.md), each recipe a
# few steps on a few rows (2 s of training, 70 s for the full schedule on this project's machine). It proves the
# folders, the adapters' recorded bases, what each recipe trains, the reuse and notebook 05's run over the recipes;
# the scores need the full schedule: `make test-demo` (--full-demo-training) trains that and runs the tests marked
# full_demo_training, which the default run skips.
SHORT_DEMO_TRAINING = dict(train_samples=16, eval_samples=8, steps=4, batch_size=4, warmup_steps=1)


def pytest_addoption(parser):
    parser.addoption("--full-demo-training", action="store_true",
                     help="train the demo's recipes on the full schedule (`make test-demo`) and run the tests of "
                          "their scores (marked full_demo_training)")


def demo_training_settings(config):
    """The schedule this session trains the demo's recipes on (`SHORT_DEMO_TRAINING` unless --full-demo-training)."""
    from workbench.demo.training import TrainingSettings

    return TrainingSettings() if config.getoption("--full-demo-training") else TrainingSettings(**SHORT_DEMO_TRAINING)


@pytest.fixture(scope="session")
def demo_recipes(demo, pytestconfig) -> DemoRecipes:
    """The demo's four recipes, trained once per test session beside the session's demo, on this session's schedule
    (`demo_training_settings`)."""
    return build_demo_recipes(demo.root, log=lambda *_: None, settings=demo_training_settings(pytestconfig))


@pytest.fixture(scope="session")
def demo_training(pytestconfig):
    """The TrainingSettings the session's demo recipes were trained with."""
    return demo_training_settings(pytestconfig)


@dataclasses.dataclass
class DemoReport:
    result: subprocess.CompletedProcess  # the CLI run: stdout, stderr, returncode
    reports: Path  # the --reports-dir it wrote into
    folder: Path  # the report folder
    hashes_before: dict  # every demo checkpoint file's sha256 before the run, and after
    hashes_after: dict


def tree_hashes(folder: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def demo_report(demo, demo_recipes, tmp_path_factory) -> DemoReport:
    """What `make diagnose` runs, run once per test session and shared by every test that reads a demo report
    (the end-to-end contract, the browser, nothing-touched): the CLI with no CKPT, on the session's demo cache."""
    reports = tmp_path_factory.mktemp("demo-reports")
    checkpoints = (demo.qwen_base, demo.qwen_stage1, demo.qwen_stage2)
    before = {str(f): tree_hashes(f) for f in checkpoints}
    result = subprocess.run([sys.executable, "-m", "workbench", "diagnose", "--reports-dir", str(reports)],
                            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                            env={**os.environ, "WORKBENCH_CACHE": str(demo.root.parent)})
    folders = [p for p in reports.glob("*/*") if p.is_dir()]
    assert len(folders) == 1, (folders, result.stdout, result.stderr)
    return DemoReport(result, reports, folders[0], before, {str(f): tree_hashes(f) for f in checkpoints})


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """`family("qwen2_tied")` -> the folder of a tiny healthy checkpoint of that family (workbench.demo.families),
    built once per test session."""
    from workbench.demo.families import build_family

    def build(name: str) -> Path:
        with built_once(tmp_path_factory, f"families-{name}") as parent:
            return build_family(name, parent)

    return build


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


# Under pytest-xdist (`make test` runs two workers), session fixtures are per worker: a test group that shares an
# expensive one runs on one worker, or the fixture is built on both. The controller schedules by node id alone, so
# the groups are listed here by node-id prefix, with the fixtures that make them one; collection fails when a test
# asks for such a fixture outside its group. (xdist's own `--dist loadgroup` renames node ids through
# `item._nodeid`, which pytest 9.2 no longer reads.)
ONE_WORKER_GROUPS = {
    # the demo's trained recipes (a minute and a half to train) and the shared demo diagnosis
    "demo-recipes": (("demo_recipes", "demo_report"),
                     ("tests/report/test_browser.py::", "tests/probes/evaluation/test_recipe_training.py::",
                      "tests/report/test_demo_report.py::",
                      "tests/report/test_hardening.py::test_checkpoint_folders_are_byte_identical_after_a_diagnosis")),
    # the sweep of three runs on the local engine and on a local Ray cluster (a minute each)
    "sweep-of-three-runs": (("local_sweep", "ray_sweep"),
                            ("tests/sweep/test_engines.py::", "tests/sweep/test_sweep_page.py::")),
    # the kernel server's own tests, on the worker's server (a server of their module's own, with its 4-5 s of
    # imports, where the session runs without one)
    "kernel-server-module": (("module_kernel_server",), ("tests/report/test_kernel_server.py::",)),
}


def one_worker_group(nodeid: str) -> str | None:
    return next((name for name, (_, prefixes) in ONE_WORKER_GROUPS.items() if nodeid.startswith(prefixes)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class GroupsOnOneWorker(LoadScopeScheduling):
        """Every test its own unit of work, except each group of ONE_WORKER_GROUPS: one unit (xdist hands out the
        units with the most tests first, so the groups start at once, on different workers)."""

        def _split_scope(self, nodeid: str) -> str:
            return one_worker_group(nodeid) or nodeid

    return GroupsOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    import torch

    for name, (fixtures, prefixes) in ONE_WORKER_GROUPS.items():
        unlisted = [(item.nodeid, fixture) for item in items for fixture in fixtures
                    if fixture in item.fixturenames and not item.nodeid.startswith(prefixes)]
        if unlisted:
            nodeid, fixture = unlisted[0]
            raise pytest.UsageError(f"{nodeid} needs {fixture}: add it to the {name!r} group of ONE_WORKER_GROUPS "
                                    "in tests/conftest.py, so that pytest-xdist runs it beside the others")
    if config is None or not config.getoption("--full-demo-training"):
        short = pytest.mark.skip(reason="needs the demo's recipes trained on the full schedule: make test-demo")
        for item in items:
            if "full_demo_training" in item.keywords:
                item.add_marker(short)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


_modules_when_frozen = [0]


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, every test module) lives as long as the worker: frozen out of
    the cyclic collector's reach, so the gc.collect() that frees each test's model scans only what tests made."""
    _freeze_what_lives()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    """The same after a test that imported modules (transformers.trainer, peft, trl, matplotlib, papermill: about
    480,000 objects): unfrozen, each of the probes', the Trainer's and free_memory's gc.collect() scans them again,
    0.1-0.2 s a call: the two workers' own CPU over a full run went from 278 to 218 s with this. Garbage is
    collected first, so only what still lives is frozen."""
    if len(sys.modules) > _modules_when_frozen[0]:
        _freeze_what_lives()


def _freeze_what_lives() -> None:
    gc.collect()
    gc.freeze()
    gc.enable()  # off while collection imported (module top); on after the freeze, which leaves nothing to scan
    _modules_when_frozen[0] = len(sys.modules)


def pytest_configure(config):
    """The verdict log's folder (tests/verdict_coverage.py); then, in a process that will run tests and not only the
    fast tier, its kernel server (tests/served_kernels.py), started now so that its imports overlap collection."""
    configure_verdict_log(config)
    config.pluginmanager.register(served_kernels, "workbench-served-kernels")  # its end-of-session report
    runs_tests = getattr(config, "workerinput", None) is not None or not getattr(config.option, "numprocesses", None)
    if not runs_tests:
        gc.enable()
    if runs_tests and "not slow" not in (config.getoption("markexpr") or ""):
        served_hub.start()  # first: the server imports the stack under the Hub's variables
        served_kernels.start()


def pytest_unconfigure(config):
    served_kernels.stop()
    served_hub.stop()
