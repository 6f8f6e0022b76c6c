"""The JupyterLab panel in a real browser (tests/headless_chromium.py): JupyterLab started on a loopback port, the
panel notebook and notebooks 01-04 opened, the panel's cell run, the widget rendered, the demo diagnosed by a click on
**Run probes**. The panel runs no notebook 05: the demo's trained recipes are not needed, and this test runs on
whichever pytest-xdist worker is free while the other trains them."""

import shutil
import time

import pytest
from headless_chromium import NEEDS_CHROMIUM, SCREENSHOTS, launched_chromium
from repo import quick_python_path

pytestmark = [pytest.mark.slow, *NEEDS_CHROMIUM]


@pytest.fixture
def browser():
    with launched_chromium() as chromium:
        yield chromium


def test_jupyterlab_opens_the_panel_and_diagnoses_the_demo_with_a_click(demo, browser, tmp_path):
    from tests import served_kernels
    from workbench.interactive.lab import lab_server
    from workbench.paths import NOTEBOOK_DIR

    server = served_kernels.running()  # the worker's kernel server, where the session runs one
    forked_before, started = server.log.read_text().count("forked a kernel") if server else 0, time.time()
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    # a copy of the notebooks: JupyterLab autosaves what it opens (the panel's output, the kernel's metadata), which
    # must not reach the committed notebooks (a slow click outlived the autosave interval and wrote into them)
    notebooks = shutil.copytree(NOTEBOOK_DIR, tmp_path / "notebooks")
    # JupyterLab's own process skips a slow optional import (tests/quick_site): what is tested is its page
    env = {"WORKBENCH_CACHE": str(demo.root.parent), "PYTHONPATH": quick_python_path()}
    with lab_server(notebooks, state_dir=tmp_path / "lab", env=env) as lab:
        page.goto(lab.url)
        # a shown cell: the notebooks open in turn, and a hidden tab's cells may come first in the page
        page.wait_for_selector(".jp-Notebook .jp-CodeCell:visible", timeout=90_000)
        labels = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel")
        labels.filter(has_text="04_forward_checks.ipynb").first.wait_for(timeout=90_000)  # the notebooks open in turn
        tabs = labels.all_inner_texts()
        assert tabs[0] == "panel.ipynb" and "04_forward_checks.ipynb" in tabs
        # the notebooks open in turn and the last one may hold the focus: bring the panel's tab forward, then click
        # its first cell once it is shown (a cell of a hidden tab comes first in the page but cannot be clicked)
        labels.filter(has_text="panel.ipynb").first.click()
        page.wait_for_selector("text=Python (workbench) | Idle", timeout=120_000)  # the kernel has started
        page.locator(".jp-Notebook .jp-CodeCell:visible").first.click()
        page.keyboard.press("Shift+Enter")
        outcome = page.wait_for_selector(".workbench-panel, [data-mime-type='application/vnd.jupyter.error']",
                                         timeout=120_000)
        panel = page.locator(".workbench-panel")
        assert panel.count() == 1, f"the panel cell raised: {outcome.inner_text()[-2000:]}"
        assert "on base" in panel.inner_text() and str(demo.qwen_stage1) in panel.inner_text()
        page.get_by_role("button", name="Run probes").click()
        page.wait_for_selector("text=done:", timeout=300_000)
        findings = page.locator(".workbench-panel table.wb-findings").last  # the Findings tab, shown at the end
        assert "forward.dtype_flow" in findings.inner_text() and "FAIL" in findings.inner_text()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "jupyterlab-panel.png")
    context.close()
    if server is not None:  # beside a kernel server, JupyterLab's kernels are forked from it, and gone with it
        assert server.log.read_text().count("forked a kernel") > forked_before, server.log.read_text()[-2000:]
        assert served_kernels.server_children(since=started) == []
