"""The demo's report in a real browser (tests/headless_chromium.py): index.html leads with the verdict table, its
links resolve, "show code" reveals the code, the page stays small and fetches nothing from the internet; screenshots
are kept beside the report. The JupyterLab panel's click is tests/interactive/test_lab_in_browser.py (it needs the
demo, not its trained recipes, so it runs beside their training)."""

import re

import pytest
from headless_chromium import NEEDS_CHROMIUM, SCREENSHOTS, launched_chromium

pytestmark = [pytest.mark.slow, *NEEDS_CHROMIUM]


@pytest.fixture(scope="module")
def browser():
    with launched_chromium() as chromium:
        yield chromium


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
