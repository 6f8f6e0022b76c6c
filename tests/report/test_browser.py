"""Reports and the JupyterLab panel in a real browser: Debian's headless Chromium driven by Playwright.

The shared report: index.html leads with the verdict table, its links resolve, "show code" reveals the code, the
page stays small and fetches nothing from the internet; screenshots are kept beside the report. JupyterLab: started
on a loopback port, the panel notebook opened, its cell run, the widget rendered, the demo diagnosed by a click.
Skipped, saying so, where Chromium or Playwright is missing (.ci/run installs Debian's chromium when it can).
"""

import re
import shutil

import pytest
from repo import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - requirements.txt pins it
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: browser tests skipped"),
    pytest.mark.skipif(sync_playwright is None, reason="Playwright is not installed: browser tests skipped"),
]
SCREENSHOTS = ROOT / "reports" / "screenshots"


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    # a shared report must open offline: any request leaving the machine fails the test
    leaks: list[str] = []
    context.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), lambda route: (leaks.append(route.request.url),
                                                                            route.abort()))
    page = context.new_page()
    yield page
    context.close()
    assert not leaks, f"the page fetched from the internet: {leaks}"


@pytest.fixture(scope="module")
def report(demo_report):
    """The session's demo report (every notebook), shared with the end-to-end tests."""
    return demo_report.folder


def test_index_leads_with_the_verdict_table_and_its_links_resolve(report, page):
    page.goto(report.joinpath("index.html").as_uri())
    assert page.locator("h1").first.inner_text().startswith("Diagnosis")
    verdicts = page.locator("table.wb-findings tbody tr td:first-child").all_inner_texts()
    assert verdicts and verdicts[0] == max(verdicts, key=["PASS", "SKIP", "INFO", "WARN", "FAIL", "ERROR"].index)
    checks = page.locator("table.wb-findings tbody code").all_inner_texts()
    assert {"parallel.trainer_wrap", "dtype.fp32_islands", "checkpoint.integrity"} <= set(checks)
    links = {a.get_attribute("href") for a in page.locator("a[href]").all()}
    local = {link for link in links if not link.startswith("#")}
    assert {"01_dtype_distribution.html", "02_dataparallel.html", "findings.json"} <= local
    assert all((report / link).exists() for link in local)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "report-index.png", full_page=True)


def test_reports_index_lists_the_run_with_its_worst_verdict(report, page):
    page.goto((report.parent.parent / "index.html").as_uri())
    row = page.locator(f'tr:has(a[href="{report.parent.name}/{report.name}/index.html"])')
    assert row.count() == 1 and re.search(r"WARN|FAIL|ERROR", row.inner_text().upper())


def test_notebook_page_hides_code_until_asked_is_small_and_offline(report, page):
    html = report / "02_dataparallel.html"
    assert html.stat().st_size < 150_000, "the lab theme's CSS is back in the report"
    assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', html.read_text())
    page.goto(html.as_uri())
    assert page.get_by_text("Will the Trainer wrap the model in DataParallel?").is_visible()
    code = page.locator(".jp-CodeCell .jp-Cell-inputWrapper").first
    assert not code.is_visible()
    page.locator("#wb-code-toggle").click()
    assert code.is_visible() and page.locator("#wb-code-toggle").inner_text() == "hide code"
    page.locator("#wb-code-toggle").click()
    assert not code.is_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "report-02_dataparallel.png"
    page.screenshot(path=shot, full_page=True)
    assert shot.stat().st_size > 50_000  # a rendered page, not a blank one


def test_jupyterlab_opens_the_panel_and_diagnoses_the_demo_with_a_click(demo, browser, tmp_path):
    from workbench.interactive.lab import lab_server

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    with lab_server(state_dir=tmp_path / "lab", env={"WORKBENCH_CACHE": str(demo.root.parent)}) as lab:
        page.goto(lab.url)
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=90_000)
        labels = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel")
        labels.filter(has_text="04_forward_checks.ipynb").first.wait_for(timeout=90_000)  # the notebooks open in turn
        tabs = labels.all_inner_texts()
        assert tabs[0] == "panel.ipynb" and "04_forward_checks.ipynb" in tabs
        page.wait_for_selector("text=Python (workbench) | Idle", timeout=120_000)  # the kernel has started
        page.locator(".jp-Notebook .jp-CodeCell").first.click()
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
