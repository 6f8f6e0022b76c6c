"""The sweep's comparison page in a real browser (Debian's headless Chromium driven by Playwright, as the reports are
read: tests/headless_chromium.py): it opens offline, its checks × members table links every verdict to a page of the
member's report that exists, its plots are inline images. Skipped, saying so, where Chromium or Playwright is
missing."""

import re

import pytest
from headless_chromium import NEEDS_CHROMIUM, SCREENSHOTS, launched_chromium
from repo import quick_python_path

pytestmark = [pytest.mark.slow, *NEEDS_CHROMIUM]


def test_the_comparison_page_reads_in_chromium_offline_with_every_verdict_linked(local_sweep):
    folder = local_sweep.folder
    members = [m["name"] for m in local_sweep.document["members"]]
    leaks: list[str] = []
    with launched_chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        context.route(re.compile(r"^https?://"), lambda route: (leaks.append(route.request.url), route.abort()))
        page = context.new_page()
        page.goto(folder.joinpath("index.html").as_uri())
        assert page.locator("h1").first.inner_text().startswith("12 · The sweep")
        table = page.locator("table:has(th:text-is('check'))")
        assert table.locator("thead th").all_inner_texts() == ["check", *members]
        rows = table.locator("tbody tr")
        checks = rows.locator("th").all_inner_texts()  # each row headed by its check
        assert {"adapter.weights", "tokenizer.vocab"} <= set(checks)
        nan_weights = rows.filter(has_text="adapter.weights").locator("td").nth(members.index("nan"))
        assert nan_weights.inner_text() == "FAIL"  # the planted fault, in its member's column
        cells = rows.locator("td a[href]")
        assert cells.count() == len(checks) * len(members)  # every verdict is a link
        targets = {cells.nth(i).get_attribute("href").split("#")[0] for i in range(cells.count())}
        assert targets and all((folder / target).is_file() for target in targets)
        assert page.locator("img[src^='data:image/png;base64']").count() >= 1  # the per-member plots, inline
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "sweep-index.png", full_page=True)
        context.close()
    assert not leaks, f"the page fetched from the internet: {leaks}"
    assert (SCREENSHOTS / "sweep-index.png").stat().st_size > 50_000  # a rendered page, not a blank one


def test_the_executed_comparison_notebook_reads_in_jupyterlab(local_sweep, tmp_path):
    """The same page as the notebook it was rendered from, opened in JupyterLab from the sweep's folder (how a user
    reads it interactively): the table with every member's column and the planted FAIL, and the plots, as saved;
    cleared and run again there, it reads the same folder."""
    from workbench.catalog import SWEEP_NOTEBOOK
    from workbench.interactive.lab import lab_server

    folder = local_sweep.folder
    members = [m["name"] for m in local_sweep.document["members"]]
    with launched_chromium() as browser, lab_server(folder, state_dir=tmp_path / "lab",
                                                    env={"PYTHONPATH": quick_python_path()}) as lab:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(lab.notebook_url(f"{SWEEP_NOTEBOOK}.ipynb"))
        table = page.locator(".jp-OutputArea-output table:has(th:text-is('check'))").first
        table.wait_for(timeout=90_000)
        assert table.locator("thead th").all_inner_texts() == ["check", *members]
        nan_weights = table.locator("tbody tr").filter(has_text="adapter.weights").locator("td")
        assert nan_weights.nth(members.index("nan")).inner_text() == "FAIL"
        # the per-member plots: JupyterLab renders a notebook's outputs cell by cell, the table's before the plots'
        page.locator(".jp-OutputArea-output img").first.wait_for(timeout=60_000)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "sweep-jupyterlab.png")
        # run again where it now lies: its sweep_dir parameter names the hidden folder the sweep was assembled in,
        # gone since the rename, and load_sweep reads the folder the notebook is opened in
        page.get_by_role("menuitem", name="Edit").click()
        page.get_by_role("menuitem", name="Clear Outputs of All Cells").click()
        assert page.locator(".jp-OutputArea-output table").count() == 0
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        outcome = page.wait_for_selector(".jp-OutputArea-output table:has(th:text-is('check')), "
                                         "[data-mime-type='application/vnd.jupyter.error']", timeout=180_000)
        assert page.locator("[data-mime-type='application/vnd.jupyter.error']").count() == 0, outcome.inner_text()
        assert table.locator("thead th").all_inner_texts() == ["check", *members]
        context.close()
    assert (SCREENSHOTS / "sweep-jupyterlab.png").stat().st_size > 30_000
